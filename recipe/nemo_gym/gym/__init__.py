# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym run out of process (its own Python environment, its own process tree and Ray), one job per module.

- `errors`: the error types every other module raises.
- `environment`: Gym's Python environment, the release it holds (0.4.x or 0.7.x), the launcher command.
- `spec`: `GymServersSpec` (what to start) and `ServerInstance` (one server the head server lists).
- `client`: HTTP to a running Gym (head server, where each agent's rows go, `/run`); no `nemo_gym` import.
- `seams`: Gym's rules the plugin mirrors (config-path resolution, the venv layout, log file names).
- `processes`: the launcher's process tree, how it is stopped, and the exit hooks that stop it.
- `watchdog`: the process that kills the tree when the trainer dies without a word.
- `health`: liveness of Gym's servers and of the policy servers.
- `outcomes`: the failure cause of a row whose `/run` failed, was refused as too long, or that Gym marked failed.
- `collect`: rows posted to their agents, outcomes returned in input order under a deadline.
- `connection`: `GymConnection`, what a running Gym gives the manager (servers, routing, `collect`).
- `launch`: `GymRuntime`, which starts, supervises and stops one configuration.
- `attach`: `AttachedGym`, a Gym someone else started, handed verl's policy address through its endpoint file.
- `relay`: `PolicyRelay`, one address in front of several policy servers (for an attached Gym).

Nothing is imported here: `recipe.nemo_gym.config` imports `seams` lazily, and `spec` imports `config`, so a
package that imported its modules would import itself in a cycle.
"""
