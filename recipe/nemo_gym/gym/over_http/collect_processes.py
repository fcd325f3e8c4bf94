# SPDX-License-Identifier: Apache-2.0
"""Collect processes: rows posted to NeMo Gym, and their results read into episodes, by child processes.

Why: the manager is one process (verl's `TaskRunner`) and, by default, posts every row and reads every result on
one event-loop thread, beside the batch's scheduling and packing; one process caps what a step can run however many
agents serve it (`benchmarks/README.md`). A long multi-turn result costs the most there: its JSON repeats every call's
prompt token IDs, about 7 ms to parse for an 8-turn episode of 15k tokens, where the `Episode` it becomes (token
arrays) crosses a socket in about 0.15 ms. With `nemo_gym.collect_processes: N` that work runs in N children; the
manager's loop keeps the routing, retries, deadline and health checks (`collect.run_examples_in_order`).

Contract:
- `CollectProcesses(reading, connector_limits)`; `await start()` on the manager's loop starts `reading.processes`
  children (`python -m recipe.nemo_gym.gym.over_http.collect_processes FD SETTINGS`: the connection limits and
  `reading`'s, given once), each joined to the parent by a socket
  pair and holding its own event loop and aiohttp session (`connector_limits` split among them, so that together
  they open no more connections than the manager alone would), and returns once each has said it is ready; one
  that is not within 60 s is a `CollectProcessDidNotStart` (a `ServerError`; the others are stopped).
- `post_run(router)` is a `post_run` for `collect.run_examples_in_order`: each row goes to the child with
  the fewest rows in flight, which posts it to the agent copy `router` picked, exactly as `client.post_row` does in
  the manager, and sends back the row's `Episode` (`packing.episode.read_episode` with `reading`'s limits) or its
  `EpisodeFailure`. A row cancelled in the parent (the deadline, an abort) is cancelled in its child.
- A child that exits aborts the batch at once: `RolloutAborted` naming the child's pid and exit status or signal
  ("the manager's collect process 4242 was killed by SIGKILL with 3 rows in flight"), for every row it held; later
  rows and batches go to the others (none left: `RolloutAborted`).
  An exception in a child (a bug, not a row's failure) is raised in the parent as `RuntimeError` with the child's
  traceback.
- `close()` closes the sockets; each child then cancels what it runs and exits, and one still alive after 5 s is
  killed. A child whose parent dies sees its socket close and exits the same way.

Messages are pickles behind a 4-byte length, over a socket pair private to the two processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.nemo_gym.errors import ServerError
from recipe.nemo_gym.failures import EpisodeFailure, RolloutAborted
from recipe.nemo_gym.gym.over_http.limits import LIMIT_KEY, LIMIT_PER_HOST_KEY
from recipe.nemo_gym.gym.types import CollectSettings

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_STOP_S = 5.0
_READY_S = 60.0
# The repository root, which holds the `recipe` package: the children import this module from it.
_REPOSITORY = Path(__file__).resolve().parents[4]


class CollectProcessDidNotStart(ServerError):
    """A collect process did not say it was ready (its imports, its session) within 60 s; `servers` names it."""


def split_limits(connector_limits: Mapping[str, Any], count: int) -> dict[str, int]:
    """Each of `count` children's connector limits: the manager's total (`limit`, default aiohttp's 100) and per-host
    limit (0: none) divided among them, at least one connection each."""
    total = int(connector_limits.get(LIMIT_KEY, 100))
    per_host = int(connector_limits.get(LIMIT_PER_HOST_KEY, 0))
    return {
        LIMIT_KEY: max(1, total // count),
        LIMIT_PER_HOST_KEY: max(1, per_host // count) if per_host else 0,
    }


def frame(message: Any) -> bytes:
    """One message as sent: its pickle behind its length."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message; `asyncio.IncompleteReadError` once the other side has closed."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


# ----------------------------------------------------------------------------------------- the parent's side


@dataclass(eq=False)
class _Child:
    process: subprocess.Popen
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    listener: asyncio.Task | None = None
    exited: str | None = None  # why it is gone, once it is

    def describe(self) -> str:
        return f"collect process {self.process.pid}"


class CollectProcesses:
    """The manager's collect processes; see the module docstring."""

    def __init__(self, reading: CollectSettings, connector_limits: Mapping[str, Any]):
        if reading.processes < 1:
            raise ValueError(f"collect processes: need at least one, got {reading.processes}")
        self.count = reading.processes
        self.reading = reading
        self.limits = split_limits(connector_limits, self.count)
        self._children: list[_Child] = []
        self._next_id = 0

    @property
    def pids(self) -> list[int]:
        return [child.process.pid for child in self._children]

    async def start(self) -> None:
        path = os.pathsep.join(filter(None, [str(_REPOSITORY), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        settings = json.dumps(
            {
                "limits": self.limits,
                "max_prompt_length": self.reading.max_prompt_length,
                "required_components": list(self.reading.required_components),
            }
        )
        for _ in range(self.count):
            ours, theirs = socket.socketpair()
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(theirs.fileno()), settings],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            reader, writer = await asyncio.open_connection(sock=ours)
            child = _Child(process, writer)
            self._children.append(child)
            try:  # its imports done and its session made: a child that cannot start fails here, not mid-batch
                await asyncio.wait_for(read_frame(reader), _READY_S)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
                await self.close()
                raise CollectProcessDidNotStart(
                    f"NeMo Gym: {child.describe()} did not start within {_READY_S:.0f} s (its exit status: "
                    f"{process.poll()}; its error, if any, is above): {e!r}",
                    servers=(child.describe(),),
                ) from None
            child.listener = asyncio.create_task(self._listen(child, reader), name=f"collect-process-{process.pid}")
        logger.warning(
            "NeMo Gym: %d collect processes post the rows and read the results (pids %s; connector limits %s each)",
            self.count,
            ", ".join(map(str, self.pids)),
            self.limits,
        )

    async def _listen(self, child: _Child, reader: asyncio.StreamReader) -> None:
        """Resolve the child's rows as its messages arrive; once it is gone, fail the rows it still held."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                row_id, kind, payload = await read_frame(reader)
                future = child.pending.pop(row_id, None)
                if future is None or future.done():
                    continue  # a row cancelled here, whose answer crossed the cancellation
                if kind == "error":
                    future.set_exception(RuntimeError(f"{child.describe()} failed on a row:\n{payload}"))
                else:
                    future.set_result(payload)
        loop = asyncio.get_running_loop()
        try:
            status = await loop.run_in_executor(None, child.process.wait, _STOP_S)
            how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
        except subprocess.TimeoutExpired:
            how = "closed its socket"
        child.exited = f"the manager's {child.describe()} {how}"
        held, child.pending = child.pending, {}
        for future in held.values():
            if not future.done():
                future.set_exception(RolloutAborted(f"{child.exited} with {len(held)} rows in flight"))

    def post_run(self, router: Any) -> Callable[[int, Mapping[str, Any]], Any]:
        """`post_run(index, row)` for `collect.run_examples_in_order` (see the module docstring); `router` is the
        batch's `replicas.LeastBusy`."""

        async def post_run(index: int, row: Mapping[str, Any]) -> Any:
            alive = [child for child in self._children if child.exited is None]
            if not alive:
                gone = "; ".join(str(child.exited) for child in self._children)
                raise RolloutAborted(f"no collect process is left: {gone}")
            child = min(alive, key=lambda c: len(c.pending))
            agent = row["agent_ref"]["name"]
            with router.route(agent) as target:
                row_id = self._next_id = self._next_id + 1
                future = asyncio.get_running_loop().create_future()
                child.pending[row_id] = future
                child.writer.write(frame(("run", row_id, (target, agent, index, row))))
                try:
                    return await future
                except asyncio.CancelledError:
                    if child.pending.pop(row_id, None) is not None and child.exited is None:
                        child.writer.write(frame(("cancel", row_id, None)))
                    raise

        return post_run

    async def close(self) -> None:
        """Close every child's socket, wait up to 5 s for the children to exit, kill the rest. Idempotent."""
        children, self._children = self._children, []
        for child in children:
            child.writer.close()
        loop = asyncio.get_running_loop()
        for child in children:
            try:
                await loop.run_in_executor(None, child.process.wait, _STOP_S)
            except subprocess.TimeoutExpired:
                logger.warning("NeMo Gym: %s did not exit within %.0f s; killing it", child.describe(), _STOP_S)
                child.process.kill()
                await loop.run_in_executor(None, child.process.wait)
            if child.listener is not None:
                await asyncio.wait([child.listener], timeout=_STOP_S)


# ----------------------------------------------------------------------------------------- the child's side


async def _serve(sock: socket.socket, settings: Mapping[str, Any]) -> None:
    from recipe.nemo_gym.gym.over_http.client import client_session, post_row
    from recipe.nemo_gym.packing.episode import read_episode

    reader, writer = await asyncio.open_connection(sock=sock)
    session = client_session(settings["limits"])
    max_prompt_length, required_components = settings["max_prompt_length"], tuple(settings["required_components"])
    running: dict[int, asyncio.Task] = {}
    writer.write(frame(("ready", os.getpid())))

    async def run(row_id: int, target: Any, agent: str, index: int, row: Mapping[str, Any]) -> None:
        try:
            outcome = await post_row(session, target, agent, index, row)
            if not isinstance(outcome, EpisodeFailure):
                outcome = read_episode(
                    outcome,
                    index,
                    max_prompt_length=max_prompt_length,
                    required_components=required_components,
                )
            writer.write(frame((row_id, "outcome", outcome)))
        except Exception:  # noqa: BLE001 - a bug here must reach the parent, not leave its row waiting
            writer.write(frame((row_id, "error", traceback.format_exc())))
        finally:
            running.pop(row_id, None)

    try:
        while True:
            try:
                kind, row_id, payload = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the parent closed its end, or is gone
            if kind == "run":
                running[row_id] = asyncio.create_task(run(row_id, *payload))
            elif (task := running.pop(row_id, None)) is not None:
                task.cancel()
    finally:
        tasks = list(running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()
        writer.close()


def main(argv: list[str] | None = None) -> None:
    fd, settings = (argv if argv is not None else sys.argv[1:])[:2]
    # Ctrl-C reaches the whole process group; the parent decides when this child stops (by closing its socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(socket.socket(fileno=int(fd)), json.loads(settings)))


if __name__ == "__main__":
    main()
