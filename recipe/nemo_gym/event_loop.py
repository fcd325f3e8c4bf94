# SPDX-License-Identifier: Apache-2.0
"""One persistent asyncio event loop on a daemon thread, usable from any thread or any other loop.

Why it exists: verl 0.9.1 runs the manager's `create` under `auto_await`, which uses `asyncio.run` when no loop
is running, so the loop `create` ran on is closed as soon as it returns. The manager's HTTP session with NeMo Gym
(the `GymConnection`'s aiohttp `ClientSession`) and the sockets of its collect processes are bound to the loop they
were made on. Every NeMo Gym call therefore goes through one loop that outlives any caller's loop: this one. In
production the agent loop manager creates the only instance and the Gym's `GymConnection` borrows it.

Contract:
- `run(coro, timeout=None)` runs a coroutine on the loop from a thread that is not the loop's own thread and
  returns its result or raises its exception. With a timeout, the task is cancelled when it passes (its own
  cleanup gets a bounded grace) and `TimeoutError` is raised naming what timed out.
- `submit(coro)` schedules without waiting and returns a `concurrent.futures.Future`; cancelling that future
  cancels the task.
- `await arun(coro)` awaits the coroutine from any other event loop (or from this one, where it simply awaits).
  Cancelling the awaiting task cancels the task on this loop.
- `close()` cancels every pending task, waits a bounded time for them, stops the loop and joins the thread.
  Idempotent. After it, `run`/`submit` raise `RuntimeError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """An event loop running forever on its own daemon thread."""

    def __init__(self, name: str = "nemo-gym-loop", cancel_grace_s: float = 5.0):
        self.name = name
        self.cancel_grace_s = cancel_grace_s
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._close_lock = threading.Lock()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _check_usable(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._closed or not self._thread.is_alive():
            coro.close()  # never awaited: close it so Python does not warn about it
            raise RuntimeError(f"event loop {self.name!r} is closed")

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        self._check_usable(coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, what: str | None = None) -> T:
        """Run `coro` on the loop and wait for it, at most `timeout` seconds."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(f"BackgroundLoop.run called from its own thread ({self.name}): it would deadlock")
        self._check_usable(coro)
        what = what or getattr(coro, "__qualname__", "coroutine")
        finished = threading.Event()
        future = self.submit(_signal_when_done(coro, finished))
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # finished in the instant between the timeout and this line
                return future.result()
            # Cancelling the concurrent future cancels the task on the loop; give its cleanup a bounded grace
            # so nothing it holds (an HTTP request, a subprocess) outlives this call unnoticed.
            future.cancel()
            finished.wait(self.cancel_grace_s)
            raise TimeoutError(
                f"{what} did not finish within {timeout:g}s on loop {self.name!r}; it was cancelled"
            ) from None

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on this loop from whichever loop the caller runs on."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def close(self, timeout: float = 10.0) -> None:
        """Cancel pending tasks, stop the loop, join the thread. Safe to call twice and from any thread but its own."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.in_loop_thread():
            raise RuntimeError(f"BackgroundLoop.close called from its own thread ({self.name})")
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(timeout), self._loop).result(timeout + 1.0)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # a task that ignores cancellation must not keep close() from stopping the loop
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> BackgroundLoop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _signal_when_done[R](coro: Coroutine[Any, Any, R], finished: threading.Event) -> R:
    try:
        return await coro
    finally:
        finished.set()


async def _cancel_all(timeout: float) -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    await asyncio.get_running_loop().shutdown_asyncgens()
