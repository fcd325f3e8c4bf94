# SPDX-License-Identifier: Apache-2.0
"""What the test suite costs, measured by the suite itself: time per tier and per module, peak memory, CPU use.

`./run_tests.sh` sets `NG_SUITE_COST_DIR` (a folder under `outputs/`) and:
- starts `python -m tests.support.suite_cost sample DIR` beside its pytest runs. It reads the machine's
  memory in use (`MemTotal - MemAvailable` of /proc/meminfo, so every process the suite starts counts) every
  `SAMPLE_S` seconds and keeps the peak in `DIR/memory.json`, with the minute of the run, the tests pytest's
  workers were running and the largest processes at that moment; and, per module, when its tests ran (first and
  last seen in a worker's title), the peak memory in use meanwhile and the machine's CPU use meanwhile (busy
  seconds of all cores, from /proc/stat: what is not idle or waiting on I/O), in `DIR/modules.json`
  (`track_modules`), and the whole run's CPU use in `DIR/cpu.json`;
- each pytest run (`tests/cpu/conftest.py`) writes `DIR/<label>.json` at its end: its wall time and, per module and
  tier, its tests and the seconds they took (setup, call and teardown summed: the module's time on its worker);
- runs `python -m tests.support.suite_cost probe DIR before` before the sampler and pytest start, and `... after`
  once they are done: the machine's speed then (`speed_probe`: a fixed single-core Python workload, its median time
  in `DIR/speed-<when>.json`). The same code's suite time varies about twofold with the hour on a shared machine;
  the probe tells one cause of that, a slower core, from the others;
- `python -m tests.support.suite_cost report DIR` prints the summary (`format_report`, pure).

Tiers, by a test's marks (`tier_of`): `e2e` runs a training job (`main_ppo`, a submit script, the launcher);
`integration` starts a server, a stack, Ray or vLLM; `unit` runs pure code. Each test's time counts in its own
tier (a module with tests of two tiers would be in both; in `tests/cpu` each tier is a folder, `unit/`,
`integration/` and `e2e/`, so a module's path names its tier).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

SAMPLE_S = 1.0
SAMPLER_FILES = ("memory.json", "modules.json", "cpu.json")
SPEED_PREFIX = "speed-"
PROBE_REPEATS = 7
GIB = 2**30
PAGE = os.sysconf("SC_PAGE_SIZE")
TIERS = ("unit", "integration", "e2e")


def tier_of(keywords: Iterable[str]) -> str:
    """A test's tier from its marks (`e2e` is also `integration`)."""
    keywords = set(keywords)
    return "e2e" if "e2e" in keywords else "integration" if "integration" in keywords else "unit"


@dataclass
class ModuleCost:
    """The tests of one module in one tier, and the seconds they took."""

    module: str
    tier: str
    tests: int = 0
    seconds: float = 0.0


@dataclass
class RunCost:
    """One pytest run: its label, its wall time, and what each module took per tier."""

    label: str
    wall_s: float
    costs: list[ModuleCost] = field(default_factory=list)

    def write(self, folder: Path) -> Path:
        path = folder / f"{self.label}.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> RunCost:
        raw = json.loads(path.read_text())
        return cls(raw["label"], raw["wall_s"], [ModuleCost(**cost) for cost in raw["costs"]])


def meminfo_bytes(meminfo: str) -> dict[str, int]:
    """The fields of /proc/meminfo's text, in bytes."""
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo.splitlines() if ":" in line}


def memory_in_use(meminfo: str) -> int:
    """Bytes in use on the machine, from the text of /proc/meminfo."""
    fields = meminfo_bytes(meminfo)
    return fields["MemTotal"] - fields["MemAvailable"]


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, all) clock ticks of every core since boot, from the text of /proc/stat (busy: not idle or iowait).
    Integers, so that busy never exceeds all in a difference of two samples (in float seconds rounding could)."""
    fields = [int(v) for v in stat.splitlines()[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(fields) - fields[3] - fields[4], sum(fields)


def track_modules(
    spans: dict[str, dict], running: Iterable[str], now: float, used: int, cpu: tuple[float, float] | None = None
) -> dict[str, dict]:
    """Fold one sample into `spans` (module -> {"first", "last", "peak_bytes"}): the modules of the tests running
    now were seen at `now`, with `used` bytes in use on the machine. `cpu`: the machine's (busy, all) CPU seconds
    since the last sample, added to each of those modules' `cpu_busy_s` and `cpu_all_s`."""
    for module in {test.split("::")[0] for test in running}:
        span = spans.setdefault(module, {"first": now, "last": now, "peak_bytes": used})
        span["last"], span["peak_bytes"] = now, max(span["peak_bytes"], used)
        if cpu is not None:
            span["cpu_busy_s"] = span.get("cpu_busy_s", 0.0) + cpu[0]
            span["cpu_all_s"] = span.get("cpu_all_s", 0.0) + cpu[1]
    return spans


def _cpu_share(span: dict) -> str:
    return f"{100 * span['cpu_busy_s'] / span['cpu_all_s']:3.0f}% CPU  " if span.get("cpu_all_s") else ""


def timeline(spans: dict[str, dict], started_at: float, *, min_s: float = 30.0) -> list[str]:
    """The modules that ran at least `min_s` seconds, in the order they started: minutes from the run's start, the
    peak machine-wide memory while each ran, and the share of the machine's CPU time that was busy meanwhile (what
    another worker ran meanwhile counts too)."""
    rows = sorted((span["first"], module, span) for module, span in spans.items()
                  if span["last"] - span["first"] >= min_s)  # fmt: skip
    return [
        f"  {(first - started_at) / 60:5.1f} to {(span['last'] - started_at) / 60:5.1f} min  "
        f"{span['peak_bytes'] / GIB:5.1f} GiB  {_cpu_share(span)}{module}"
        for first, module, span in rows
    ]


def speed_probe(repeats: int = PROBE_REPEATS) -> list[float]:
    """The seconds a fixed single-core Python workload took, `repeats` times (24-25 ms each on the CI machine kind,
    idle, 2026-11-29). Pure Python, as most of the suite's CPU time is: a slower interpreter loop is a slower suite."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(400_000):
            total += i * i % 7
        times.append(time.perf_counter() - started)
    return times


def format_speeds(speeds: dict[str, list[float]]) -> str:
    """One line: the probe's median time at each moment it ran (`speeds`: when -> seconds of each repeat)."""
    parts = [f"{statistics.median(times) * 1000:.0f} ms {when} the run" for when, times in speeds.items()]
    repeats = {len(times) for times in speeds.values()}
    return (f"the machine's speed: a fixed single-core Python workload took {', '.join(parts)} (median of "
            f"{'/'.join(str(n) for n in sorted(repeats))}; lower is faster)")  # fmt: skip


def format_report(
    runs: list[RunCost],
    memory: dict | None,
    *,
    slowest: int = 10,
    spans: dict | None = None,
    speeds: dict[str, list[float]] | None = None,
    cpu: dict | None = None,
) -> str:
    """The summary `./run_tests.sh` prints at its end."""
    lines = ["", "=" * 30 + " what the suite cost " + "=" * 30]
    for run in runs:
        lines.append(f"run {run.label}: {run.wall_s / 60:.1f} min wall, {sum(c.tests for c in run.costs)} tests")
    lines.append(f"total wall: {sum(run.wall_s for run in runs) / 60:.1f} min")
    lines.append("per tier (its tests' time summed, on whichever worker ran them):")
    for tier in TIERS:
        costs = [c for run in runs for c in run.costs if c.tier == tier]
        if costs:
            modules = len({(run.label, c.module) for run in runs for c in run.costs if c.tier == tier})
            lines.append(f"  {tier:<12} {modules:>3} modules {sum(c.tests for c in costs):>4} tests "
                         f"{sum(c.seconds for c in costs) / 60:6.1f} min")  # fmt: skip
    per_module: dict[str, float] = {}
    for run in runs:
        for cost in run.costs:
            key = f"{run.label}: {cost.module}"
            per_module[key] = per_module.get(key, 0.0) + cost.seconds
    ranked = sorted(per_module.items(), key=lambda item: -item[1])[:slowest]
    lines.append(f"the {len(ranked)} slowest modules:")
    lines += [f"  {seconds:7.1f} s  {name}" for name, seconds in ranked]
    if memory:
        lines.append(
            f"peak memory in use: {memory['peak_bytes'] / GIB:.1f} GiB of {memory['total_bytes'] / GIB:.1f} GiB "
            f"(machine-wide, sampled every {memory['sample_s']:g} s; {memory['start_bytes'] / GIB:.1f} GiB at start)"
        )
        if "started_at" in memory:
            lines.append(
                f"  at minute {(memory['peak_at'] - memory['started_at']) / 60:.1f} of the run, while running:"
            )
            lines += [f"    {test}" for test in memory.get("running", [])]
        lines.append("  the largest processes then:")
        lines += [f"  {line}" for line in memory.get("largest_processes", [])]
    else:
        lines.append("peak memory: not sampled")
    if cpu and cpu.get("all_s"):
        lines.append(
            f"the machine's CPU: busy {100 * cpu['busy_s'] / cpu['all_s']:.0f}% of the run's CPU time "
            f"({cpu['cores']} cores; not idle or waiting on I/O, machine-wide)"
        )
    if spans and memory and "started_at" in memory:
        cpu_part = ", and the share of CPU time busy" if any("cpu_all_s" in span for span in spans.values()) else ""
        lines.append(f"when the modules of 30 s or more ran, the peak memory in use meanwhile{cpu_part}:")
        lines += timeline(spans, memory["started_at"])
    if speeds:
        lines.append(format_speeds(speeds))
    return "\n".join(lines)


def _processes() -> list[tuple[int, str, str]]:
    """(resident bytes, pid, command line) of every live process, read from /proc once."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            rss = int((proc / "statm").read_text().split()[1]) * PAGE
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue  # it ended while being read
        found.append((rss, proc.name, command))
    return found


def largest_processes(count: int = 8, processes: list[tuple[int, str, str]] | None = None) -> list[str]:
    """The `count` processes with the most resident memory: "<GiB> GiB pid <pid>: <command line>"."""
    ranked = sorted(_processes() if processes is None else processes, key=lambda p: p[0], reverse=True)
    return [f"{rss / GIB:.2f} GiB pid {pid}: {command[:160]}" for rss, pid, command in ranked[:count]]


XDIST_TITLE = "[pytest-xdist running] "
"""How pytest-xdist titles a worker process while it runs a test (its `setproctitle`), followed by the test's id."""


def running_tests(titles: Iterable[str]) -> list[str]:
    """The tests pytest-xdist's workers are running, read from the processes' titles (command lines)."""
    return sorted(title[len(XDIST_TITLE) :].strip() for title in titles if title.startswith(XDIST_TITLE))


def _replace(path: Path, record: dict) -> None:
    """Write `record` as JSON to `path` whole (a reader never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record))
    partial.replace(path)


def sample(folder: Path) -> None:
    """Sample memory in use until SIGTERM; keep the peak in `folder/memory.json` and the modules' spans in
    `folder/modules.json` (each replaced whole each time)."""
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    meminfo, stat = Path("/proc/meminfo"), Path("/proc/stat")
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    cpu_start = cpu_last = cpu_ticks(stat.read_text())
    text = meminfo.read_text()
    total = meminfo_bytes(text)["MemTotal"]
    start = peak = memory_in_use(text)
    started_at = time.time()
    out = folder / "memory.json"
    spans: dict[str, dict] = {}
    written = 0.0
    while True:
        used = memory_in_use(meminfo.read_text())
        now, processes, cpu_now = time.time(), _processes(), cpu_ticks(stat.read_text())
        delta = ((cpu_now[0] - cpu_last[0]) * tick_s, (cpu_now[1] - cpu_last[1]) * tick_s)
        cpu_last = cpu_now
        track_modules(spans, running_tests(command for _, _, command in processes), now, used, delta)
        if now - written >= 5 or not running:
            _replace(folder / "modules.json", spans)
            busy, every = (cpu_now[0] - cpu_start[0]) * tick_s, (cpu_now[1] - cpu_start[1]) * tick_s
            _replace(folder / "cpu.json", {"busy_s": busy, "all_s": every, "cores": os.cpu_count()})
            written = now
        if used >= peak or not out.exists():
            peak = max(peak, used)
            record = {"peak_bytes": peak, "start_bytes": start, "total_bytes": total, "sample_s": SAMPLE_S,
                      "started_at": started_at, "peak_at": now,
                      "largest_processes": largest_processes(processes=processes),
                      "running": running_tests(command for _, _, command in processes)}  # fmt: skip
            _replace(out, record)
        if not running:
            return
        time.sleep(SAMPLE_S)


def probe(folder: Path, when: str) -> None:
    _replace(folder / f"{SPEED_PREFIX}{when}.json", {"when": when, "seconds": speed_probe()})


def report(folder: Path) -> str:
    by_time = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    runs = [RunCost.read(path) for path in by_time
            if path.name not in SAMPLER_FILES and not path.name.startswith(SPEED_PREFIX)]  # fmt: skip
    memory, spans, cpu = (
        json.loads((folder / name).read_text()) if (folder / name).exists() else None for name in SAMPLER_FILES
    )
    probes = [json.loads(path.read_text()) for path in by_time if path.name.startswith(SPEED_PREFIX)]
    speeds = {record["when"]: record["seconds"] for record in probes}
    return format_report(runs, memory, spans=spans, speeds=speeds, cpu=cpu)


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2])
    if command == "sample":
        sample(folder)
    elif command == "report":
        print(report(folder))
    elif command == "probe" and len(sys.argv) == 4:
        probe(folder, sys.argv[3])
    else:
        raise SystemExit(f"usage: python -m {__spec__.name} sample|report DIR, or probe DIR WHEN")
