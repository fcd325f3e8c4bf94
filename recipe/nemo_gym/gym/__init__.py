# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym 0.4.0's servers under the plugin's control, one job per module.

- `errors`: the error types every other module raises.
- `spec`: `GymServersSpec` (what to start) and `ServerInstance` (what a parsed configuration holds).
- `seams`: every place that touches NeMo Gym's internals or mirrors one of its rules (import containment,
  `RunHelper`'s private state, the install root, config-path resolution, the venv layout).
- `processes`: the processes a runtime started, how they are stopped, and the exit hooks that stop them.
- `health`: liveness of NeMo Gym's servers and of the policy servers.
- `outcomes`: the failure cause of a row whose `/run` failed or was refused as too long.
- `collect`: rows posted to their agents, outcomes returned in input order under a deadline.
- `launch`: `GymRuntime`, which starts, supervises and stops one configuration.

Nothing is imported here: `recipe.nemo_gym.config` imports `seams` lazily, and `spec` imports `config`, so a
package that imported its modules would import itself in a cycle.
"""
