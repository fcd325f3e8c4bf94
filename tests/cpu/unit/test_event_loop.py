# SPDX-License-Identifier: Apache-2.0
"""`BackgroundLoop` (`recipe/nemo_gym/event_loop.py`): run from threads and other loops, timeouts that cancel and
name what timed out, a close that cancels what is pending."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from recipe.nemo_gym.event_loop import BackgroundLoop

# ------------------------------------------------------------------------------------------ event loop


def test_background_loop_runs_from_threads_and_other_loops() -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        return a + b

    with BackgroundLoop() as bg:
        assert bg.run(add(1, 2)) == 3
        results = []
        threads = [threading.Thread(target=lambda i=i: results.append(bg.run(add(i, i)))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 2, 4, 6]
        assert asyncio.run(bg.arun(add(2, 3))) == 5  # from a loop that is then closed, as verl's create() is

        async def loop_identity() -> int:
            return id(asyncio.get_running_loop())

        assert bg.run(loop_identity()) == id(bg.loop)


def test_background_loop_timeout_cancels_the_task_and_says_what_timed_out() -> None:
    cleaned = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    async def raises_timeout() -> None:
        raise TimeoutError("the coroutine's own")

    with BackgroundLoop() as bg:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"my batch did not finish within 0.2s.*cancelled"):
            bg.run(slow(), timeout=0.2, what="my batch")
        assert time.monotonic() - t0 < 5 and cleaned.is_set()
        with pytest.raises(TimeoutError, match="the coroutine's own"):
            bg.run(raises_timeout(), timeout=5)


def test_background_loop_close_cancels_pending_tasks_and_is_idempotent() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    bg = BackgroundLoop()
    future = bg.submit(forever())
    time.sleep(0.05)
    bg.close()
    bg.close()
    assert cancelled.is_set() and future.cancelled()
    assert not bg._thread.is_alive() and bg.loop.is_closed()
    with pytest.raises(RuntimeError, match="is closed"):
        bg.run(asyncio.sleep(0))
