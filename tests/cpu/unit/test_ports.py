# SPDX-License-Identifier: Apache-2.0
"""`recipe.nemo_gym.ports`: ports picked between NeMo Gym's server range and the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from recipe.nemo_gym.ports import DEFAULT_EPHEMERAL_LOW, ephemeral_low, pick_free_port, pick_free_ports, quiet_band


@pytest.mark.parametrize(
    ("text", "low"),
    [("32768\t60999\n", 32768), ("40000 65000", 40000), ("", DEFAULT_EPHEMERAL_LOW), ("x y", DEFAULT_EPHEMERAL_LOW)],
)
def test_the_ephemeral_range_is_read_from_the_kernels_file_and_defaults_to_linuxs(tmp_path, text, low) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_low(path) == low
    assert ephemeral_low(tmp_path / "missing") == DEFAULT_EPHEMERAL_LOW


@pytest.mark.parametrize(
    ("start", "band"),
    [(32768, range(20001, 32768)), (21001, range(20001, 21001)), (21000, range(0)), (1024, range(0))],
)
def test_the_quiet_band_lies_above_gyms_server_ports_and_below_the_ephemeral_range(start, band) -> None:
    assert quiet_band(start) == band


def test_picked_ports_differ_bind_now_and_lie_in_the_quiet_band() -> None:
    band = quiet_band(ephemeral_low(Path("/proc/sys/net/ipv4/ip_local_port_range")))
    ports = pick_free_ports(20)
    assert len(set(ports)) == 20
    assert all(port in band for port in ports) if band else all(ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_picked(monkeypatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        band = range(taken, taken + 1)
        monkeypatch.setattr("recipe.nemo_gym.ports.quiet_band", lambda _start: band)
        port = pick_free_port()  # the band's one port is held: the kernel's choice instead
    assert port != taken and port > 0
