# SPDX-License-Identifier: Apache-2.0
"""The connection limits NeMo Gym's servers and the manager get from the file limit
(`recipe/nemo_gym/gym/over_http/limits.py`), with exact values. The load they allow is measured in
`tests/cpu/integration/test_load.py`."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.gym.over_http.limits import (
    LIMIT_KEY,
    LIMIT_PER_HOST_KEY,
    UNLIMITED,
    ConnectionLimits,
    derive_connection_limits,
    server_soft_limit,
)


@pytest.mark.parametrize(
    ("soft", "hard", "total", "per_host", "servers_soft"),
    [
        (1024, 1024, 384, 153, 1024),  # servers cannot raise theirs: (1024 - 256) // 2, // 5
        (20000, 20000, 8750, 1024, 20000),  # (20000 - 2500) // 2; per host capped at NeMo Gym's 1024
        (65535, 65535, 28672, 1024, 65535),  # (65535 - 8191) // 2
        (UNLIMITED, UNLIMITED, 28672, 1024, 65535),  # servers lower an unlimited soft limit to 65535
        (1024, 1048576, 768, 768, 65535),  # servers raise theirs; the manager's own 1024 - 256 binds
        (20000, UNLIMITED, 17500, 1024, 65535),
        (1048576, 1048576, 102400, 1024, 1048576),  # never above NeMo Gym's own default total
    ],
)
def test_connection_limits_are_derived_from_the_file_limit(soft, hard, total, per_host, servers_soft):
    assert derive_connection_limits(soft, hard) == ConnectionLimits(
        total=total, per_host=per_host, soft=soft, hard=hard, server_soft=servers_soft, below_floor=False
    )


def test_a_tiny_file_limit_gets_the_floor_and_is_flagged():
    assert derive_connection_limits(256, 256) == ConnectionLimits(
        total=16, per_host=8, soft=256, hard=256, server_soft=256, below_floor=True
    )
    assert derive_connection_limits(300, 300) == ConnectionLimits(22, 8, 300, 300, 300)  # 44 // 2, 44 // 5: fits
    assert derive_connection_limits(290, 290) == ConnectionLimits(17, 8, 290, 290, 290, below_floor=True)  # 34 // 5


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [(1024, 1024, 1024), (1024, 65535, 65535), (1024, UNLIMITED, 65535), (70000, 80000, 70000)],
)
def test_server_soft_limit_mirrors_nemo_gym_set_ulimit(soft, hard, expected):
    assert server_soft_limit(soft, hard) == expected
    assert server_soft_limit(UNLIMITED, UNLIMITED) == 65535


def test_user_overrides_win_over_derived_limits():
    limits = derive_connection_limits(1024, 1024)
    assert limits.as_overrides() == {LIMIT_KEY: 384, LIMIT_PER_HOST_KEY: 153}
    user = {LIMIT_PER_HOST_KEY: 50, "policy_model": {"x": 1}}
    assert limits.merged_under(user) == {LIMIT_KEY: 384, LIMIT_PER_HOST_KEY: 50, "policy_model": {"x": 1}}
    assert user == {LIMIT_PER_HOST_KEY: 50, "policy_model": {"x": 1}}  # not modified


@pytest.mark.parametrize(
    ("soft", "hard", "error", "needle"),
    [(2048, 1024, ValueError, "above the hard limit"), (-5, 1024, ValueError, "soft"), (1.5, 1024, TypeError, "int")],
)
def test_impossible_file_limits_are_rejected_naming_the_value(soft, hard, error, needle):
    with pytest.raises(error, match=needle):
        derive_connection_limits(soft, hard)
