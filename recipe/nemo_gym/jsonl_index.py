# SPDX-License-Identifier: Apache-2.0
"""Byte-offset index of a JSONL file: where each non-blank line starts, without keeping any line.

`index_jsonl(path)` scans the file in fixed-size chunks (memory bounded by the chunk, whatever the file size)
and returns the start offsets of its non-blank lines as an int64 array: 8 bytes per row. A line is blank when
it holds only ASCII whitespace (`\\r\\n` endings included); blank lines are skipped, so row k of the index is
the k-th non-blank line. A UTF-8 byte-order mark at the start of the file is skipped. A last line without a
trailing newline is a row.

`read_line(fd, offsets, k, file_size)` reads row k back with one positional read (`os.pread`: no shared file
position, so it is safe in forked DataLoader workers), and `line_number(path, offset)` turns an offset into a
1-based line number for error messages (a scan; only used on the error path).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["index_jsonl", "line_number", "read_line"]

_BOM = b"\xef\xbb\xbf"
# ASCII whitespace as bytes.strip() sees it; "\n" is the line separator itself.
_WHITESPACE = np.array([ord(c) for c in " \t\r\x0b\x0c"], dtype=np.uint8)
DEFAULT_CHUNK_BYTES = 4 << 20


def index_jsonl(path: str | os.PathLike, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """Start offsets (int64, increasing) of the non-blank lines of the file at `path`."""
    kept: list[np.ndarray] = []
    # Lines whose first byte is whitespace may be blank; checked after the scan by reading them (rare).
    maybe_blank: list[tuple[int, int]] = []
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        line_start = 3 if file.read(3) == _BOM else 0
        file.seek(0)
        pos = 0  # file offset of the current chunk
        pending_first: int | None = None  # first byte of the line starting at line_start, if already read

        def classify(starts: np.ndarray, ends: np.ndarray, first: np.ndarray) -> None:
            non_empty = starts < ends
            ws = np.isin(first, _WHITESPACE)
            kept.append(starts[non_empty & ~ws])
            maybe_blank.extend(zip(starts[non_empty & ws].tolist(), ends[non_empty & ws].tolist(), strict=True))

        while chunk := file.read(chunk_bytes):
            buf = np.frombuffer(chunk, dtype=np.uint8)
            if pending_first is None and line_start < pos + len(buf):
                pending_first = int(buf[line_start - pos])
            newlines = np.flatnonzero(buf == 10).astype(np.int64) + pos
            if len(newlines):
                starts = np.empty(len(newlines), dtype=np.int64)
                starts[0] = line_start
                starts[1:] = newlines[:-1] + 1
                first = np.zeros(len(newlines), dtype=np.uint8)
                inside = starts >= pos
                first[inside] = buf[starts[inside] - pos]
                if not inside[0]:  # the first line began in an earlier chunk
                    first[0] = pending_first
                classify(starts, newlines, first)
                line_start = int(newlines[-1]) + 1
                pending_first = int(buf[line_start - pos]) if line_start < pos + len(buf) else None
            pos += len(buf)
        if line_start < size:
            classify(
                np.array([line_start], dtype=np.int64),
                np.array([size], dtype=np.int64),
                np.array([pending_first], dtype=np.uint8),
            )
        rescued = []
        for start, end in maybe_blank:
            file.seek(start)
            if file.read(end - start).strip():
                rescued.append(start)
    offsets = np.concatenate([*kept, np.array(rescued, dtype=np.int64)]) if kept or rescued else np.empty(0, np.int64)
    offsets.sort()
    return offsets


def read_line(fd: int, offsets: np.ndarray, k: int, file_size: int) -> bytes:
    """Bytes of row k (without its line ending's "\\n") from an open file descriptor."""
    start = int(offsets[k])
    end = int(offsets[k + 1]) if k + 1 < len(offsets) else file_size
    data = os.pread(fd, end - start, start)
    cut = data.find(b"\n")
    return data if cut < 0 else data[:cut]


def line_number(path: str | os.PathLike, offset: int, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """1-based line number of the line that starts at byte `offset` (counts the newlines before it)."""
    count = 0
    with open(path, "rb") as file:
        remaining = offset
        while remaining > 0 and (chunk := file.read(min(chunk_bytes, remaining))):
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count + 1
