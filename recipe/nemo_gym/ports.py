# SPDX-License-Identifier: Apache-2.0
"""Ports a process will listen on later, picked where nothing else on the node takes ports unasked.

Contract:
- `pick_free_ports(count, host)` returns `count` distinct TCP ports that bind on `host` now (with SO_REUSEADDR, as
  uvicorn and Ray bind), drawn at random from the quiet band (`quiet_band`), never from the kernel's ephemeral range.
- Why not the kernel's choice (`bind(port 0)`): that port comes from the ephemeral range, and every outgoing
  connection on the node takes its local port from that same range. A port picked there and listened on seconds or
  minutes later (NeMo Gym's head server starts after verl's whole start-up) can meanwhile be held by any process's
  connection, and the later bind fails with EADDRINUSE: NeMo Gym's launcher then ends with "Head server finished
  unexpectedly!". The quiet band lies above NeMo Gym's own server ports (`port_range_low`/`port_range_high`,
  10001-20000 in 0.4 and 0.7; `ray start` gives Ray's workers 10002-19999 by default, there too) and below the
  ephemeral range; on a default Linux node that is 20001-32767. Nothing there is taken unless a program names it.
- A port is still only free when picked: the caller checks again just before it binds (`bind_problem`, which
  `gym.owned.launch.check_port_free` asks for NeMo Gym's head server). Two pickers at once collide with a chance of
  about one in the band's size.
- `bind_problem(host, port)`: None when the port binds now as uvicorn binds it, else why not, naming the process
  that listens there when the OS shows it (`port_holder`).
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

import psutil

# Above NeMo Gym's default server port range (global_config.py, `port_range_high`, 0.4.0 and 0.7.0).
GYM_PORT_RANGE_HIGH = 20000
# Linux's default ephemeral range starts here; `ephemeral_low` reads the node's own.
DEFAULT_EPHEMERAL_LOW = 32768
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_MIN_BAND = 1000
_TRIES = 200


def ephemeral_low(path: Path = _EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel hands out for outgoing connections (Linux's `ip_local_port_range`)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def quiet_band(ephemeral_start: int) -> range:
    """Ports between NeMo Gym's server range and the ephemeral range; empty when fewer than 1000 lie there (a node
    whose ephemeral range was widened down), and then the picker falls back to the kernel's choice."""
    band = range(GYM_PORT_RANGE_HIGH + 1, min(ephemeral_start, 65536))
    return band if len(band) >= _MIN_BAND else range(0)


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that bind on `host` now, from the quiet band (see the module docstring)."""
    band = quiet_band(ephemeral_low())
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held: list[socket.socket] = []
    try:
        candidates = random.sample(band, min(len(band), _TRIES)) if band else []
        for port in [*candidates, *[0] * count]:  # the kernel's choice only if the band had too few free
            if len(held) == count:
                break
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)  # held until all are picked, so they differ
        if len(held) < count:
            raise OSError(f"no {count} free TCP port(s) on {host!r}")
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def pick_free_port(host: str = "127.0.0.1") -> int:
    """One port that binds on `host` now, from the quiet band."""
    return pick_free_ports(1, host)[0]


def port_holder(port: int) -> str | None:
    """`pid N (name)` of a process listening on `port`, when the OS lets us see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        pass
    return None


def bind_problem(host: str, port: int) -> str | None:
    """None when `host:port` can be bound now with SO_REUSEADDR (as uvicorn binds); else why not, as
    `" by pid N (name) (Address already in use)"` (the holder only where the OS shows it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            holder = port_holder(port)
            return f"{f' by {holder}' if holder else ''} ({e.strerror})"
    return None
