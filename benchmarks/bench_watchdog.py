# SPDX-License-Identifier: Apache-2.0
"""What the NeMo Gym server watchdog costs while it only watches: its CPU per second of a training run.

The watchdog (`recipe/nemo_gym/gym/watchdog.py`) lives as long as the Gym it guards and, once a second, looks
for new descendants of the processes it watches. This starts `--watched` idle processes (each a shell with a
`sleep` child, as Gym's launcher wraps each server), `--others` idle processes it does not watch (a node's process
table is larger than the Gym's), spawns the real watchdog, registers the shells, and reads the watchdog's CPU time
over `--seconds`. It then releases the watchdog and checks that it killed every watched process and no other.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_watchdog.py [--watched 20] [--others 300] [--seconds 30]
"""

from __future__ import annotations

import argparse
import subprocess
import time

import psutil

from recipe.nemo_gym.gym.watchdog import Watchdog


def idle(count: int, wrapped: bool) -> list[subprocess.Popen]:
    command = ["sh", "-c", "sleep 600; :"] if wrapped else ["sleep", "600"]
    return [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watched", type=int, default=20)
    parser.add_argument("--others", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()

    watched, others = idle(args.watched, wrapped=True), idle(args.others, wrapped=False)
    try:
        time.sleep(0.5)  # the shells have started their sleeps
        watchdog = Watchdog.spawn()
        for proc in watched:
            watchdog.register(proc.pid)
        dog = psutil.Process(watchdog.pid)
        time.sleep(2.0)  # it has read the pids and found their children
        start = sum(dog.cpu_times()[:2])
        time.sleep(args.seconds)
        spent = sum(dog.cpu_times()[:2]) - start
        table = len(psutil.pids())
        sleeps = [child for proc in watched for child in psutil.Process(proc.pid).children()]
        watchdog.release(wait_s=10.0)
        for proc in watched:
            proc.wait(timeout=10)
        killed = sum(proc.returncode == -9 for proc in watched)
        _, left = psutil.wait_procs(sleeps, timeout=10)
        spared = sum(proc.poll() is None for proc in others)
    finally:
        for proc in watched + others:
            proc.kill()
            proc.wait()
    print(
        f"watchdog: {1000 * spent / args.seconds:.1f} CPU-ms per second ({100 * spent / args.seconds:.2f}% of a core) "
        f"watching {args.watched} processes and their children, {table} processes on the machine; "
        f"on release it killed {killed} of {args.watched} watched and {len(sleeps) - len(left)} of their {len(sleeps)} "
        f"children, spared {spared} of {args.others} others"
    )


if __name__ == "__main__":
    main()
