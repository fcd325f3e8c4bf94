#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install Slurm and munge (Debian/Ubuntu packages slurm-wlm and munge) when they are missing, for the tests
# that run the submit scripts under a private Slurm cluster (tests/cpu/e2e/test_slurm.py, test_slurm_training.py),
# and iproute2, whose `ip` gives the two-node test's nodes their network namespaces (test_two_nodes.py).
#
# Called by run_tests.sh before pytest. Quiet when everything is there. Never fails the test run: when it
# cannot install (not root, no apt-get, no network), it says so and returns 0; the Slurm tests then fail
# with the same hint (or skip where NG_SLURM_TESTS=skip). NG_SLURM_INSTALL=0 turns the install off.
# No service is started: while apt runs, a policy-rc.d that denies service starts is put in place if the
# machine has none (and removed afterwards).
set -uo pipefail

NEEDED_COMMANDS=(sbatch srun scontrol sinfo slurmctld slurmd munged ip)
PACKAGES=(slurm-wlm munge iproute2)
INSTALL_HINT="apt-get install -y --no-install-recommends ${PACKAGES[*]}"
APT_TIMEOUT_S="${NG_SLURM_APT_TIMEOUT_S:-300}"

say() { echo "install_slurm: $*" >&2; }

missing=()
for cmd in "${NEEDED_COMMANDS[@]}"; do
    # slurmctld, slurmd and munged live in /usr/sbin, which a non-root PATH may lack.
    command -v "$cmd" >/dev/null 2>&1 || [[ -x "/usr/sbin/$cmd" ]] || missing+=("$cmd")
done
((${#missing[@]} == 0)) && exit 0

if [[ "${NG_SLURM_INSTALL:-1}" == 0 ]]; then
    say "Slurm commands missing (${missing[*]}); NG_SLURM_INSTALL=0, not installing. Install with: $INSTALL_HINT"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    say "Slurm commands missing (${missing[*]}) and not running as root, so not installing them." \
        "The Slurm tests will fail; install with: sudo $INSTALL_HINT"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "Slurm commands missing (${missing[*]}) and no apt-get here. The Slurm tests will fail; install Slurm" \
        "(slurmctld, slurmd, client commands) and munge with this system's package manager."
    exit 0
fi

log=$(mktemp "${TMPDIR:-/tmp}/install_slurm.XXXXXX.log")
policy=/usr/sbin/policy-rc.d
own_policy=0
# shellcheck disable=SC2329  # invoked by the EXIT trap
remove_own_policy() { if ((own_policy)); then rm -f "$policy"; fi; }
trap remove_own_policy EXIT
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\n# Temporary (tests/cpu/install_slurm.sh): no service starts while packages install.\nexit 101\n' \
        >"$policy" && chmod 755 "$policy" && own_policy=1
fi

apt_install() {
    DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" apt-get install -y -q --no-install-recommends \
        -o DPkg::Lock::Timeout=60 "${PACKAGES[@]}" >>"$log" 2>&1
}

say "installing ${PACKAGES[*]} with apt-get (missing: ${missing[*]}; log: $log)"
start=$SECONDS
if ! apt_install; then
    # Stale or absent package lists are the usual cause: refresh them once and try again.
    say "apt-get install failed; running apt-get update and retrying"
    if ! { DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" apt-get update -q >>"$log" 2>&1 && apt_install; }; then
        say "could not install ${PACKAGES[*]} (last lines of $log below). The Slurm tests will fail;" \
            "install with: $INSTALL_HINT"
        tail -n 15 "$log" >&2
        exit 0
    fi
fi
say "installed ${PACKAGES[*]} in $((SECONDS - start)) s"
rm -f "$log"
exit 0
