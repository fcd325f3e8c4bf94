# SPDX-License-Identifier: Apache-2.0
"""What a failed training run died of, read from its console output: the lines a user needs, not the ~1,000 around.

`failure_cause(text)` is pure. A failed `main_ppo` ends in a Python traceback whoever raised: our manager (its
message names the server, the rows, the deadline or the rule), verl, or Ray. Ray re-raises an exception from an
actor in the driver as `ray.exceptions.RayTaskError(<Type>): ray::<Actor>.<method>() (pid=..., ...)` followed by the
actor's traceback and the original `<Type>: <message>` line; such wrapper lines say where, not what, and are
skipped. The cause is the last exception line of the last traceback that is not a wrapper, with the lines of its
message that follow it (a message may span lines: a list of bad rows, a server's log tail), at most
`MAX_LINES`. Prefixes the demo's console and Ray add to each line (`[ 12.3s] `, `(TaskRunner pid=492) `, colour
codes) are removed first.

The launcher calls it on the trainer's last lines when the trainer fails (`supervise.py`) and ends the job's output
with the cause. `python -m recipe.nemo_gym.launch.failure_cause LOG` prints the cause of the run whose console output
is in LOG (a saved log read again, `docs/troubleshooting.md`), or nothing when the log holds no traceback.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

MAX_LINES = 6
"""Lines of a cause shown at most (the exception line included); a longer message says how many were left out."""
MAX_LINE_CHARS = 400

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RUNNER_PREFIX = re.compile(r"^\[\s*\d+(?:\.\d+)?s\](?: |$)")  # the demo's time stamp (recipe/nemo_gym_demo/console.py)
_RAY_PREFIX = re.compile(r"^\((?:[\w.:-]+ )?pid=\d+(?:, ip=[\w.:-]+)?\)\s*")  # Ray's tag on a worker's line
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*?(?:Error|Exception|Aborted|Died|Unreachable|Mismatch|Exceeded|"
    r"Timeout|Interrupt|Exit))(?:\((?P<wrapped>[\w.]+)\))?)(?:: (?P<message>.*))?$"
)
_TRACEBACK = "Traceback (most recent call last):"
# Lines that end an exception's message: the start of another traceback part, or what Hydra and Ray print after it.
_MESSAGE_ENDS = (
    _TRACEBACK,
    "During handling of the above exception",
    "The above exception was the direct cause",
    "Set the environment variable HYDRA_FULL_ERROR",
    "Object store memory usage:",  # Ray's out-of-memory report: the lines before it say what was killed and why
    "Error executing job with overrides",
)


@dataclass(frozen=True)
class TracebackCause:
    exception: str
    """The exception's class name, without its module (`RolloutAborted`, `OutOfMemoryError`)."""
    lines: tuple[str, ...]
    """`<name>: <message>` and the message's further lines, as printed (at most `MAX_LINES`)."""

    def __str__(self) -> str:
        return "\n".join(self.lines)


def clean_line(line: str) -> str:
    """A console line without colour codes, the demo's time prefix or Ray's process tag."""
    line = _ANSI.sub("", line.rstrip("\n"))
    line = _RUNNER_PREFIX.sub("", line)
    return _RAY_PREFIX.sub("", line)


def failure_cause(text: str) -> TracebackCause | None:
    """The innermost exception of the last traceback in a run's console output; None when there is none."""
    lines = [clean_line(line) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return None
    chosen: tuple[int, re.Match[str]] | None = None
    for i in range(starts[-1] + 1, len(lines)):
        match = _EXCEPTION.match(lines[i])
        if match is None or _is_wrapper(match):
            continue
        chosen = (i, match)
    if chosen is None:
        return None
    i, match = chosen
    first = match["name"] + (f": {match['message']}" if match["message"] is not None else "")
    message = [first]
    for line in lines[i + 1 :]:
        if not line.strip() or line.startswith(_MESSAGE_ENDS) or line.lstrip().startswith('File "'):
            break
        if _EXCEPTION.match(line):
            break
        message.append(line)
    shown = [_clip(line) for line in message[:MAX_LINES]]
    if len(message) > MAX_LINES:
        shown[-1] = f"... ({len(message) - MAX_LINES + 1} more lines in the log)"
    return TracebackCause(exception=match["name"], lines=tuple(shown))


def _is_wrapper(match: re.Match[str]) -> bool:
    """Ray's `RayTaskError(<Type>): ray::<Actor>.<method>() (pid=...)`: where an actor raised, not what."""
    return match["wrapped"] is not None or (match["message"] or "").startswith("ray::")


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m recipe.nemo_gym.launch.failure_cause LOG", file=sys.stderr)
        return 2
    with open(argv[0], errors="replace") as f:
        cause = failure_cause(f.read())
    if cause is not None:
        print(cause)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
