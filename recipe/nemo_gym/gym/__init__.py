# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym run out of process (its own Python environment, its own process tree and Ray), used over HTTP.

The manager gets a connected Gym from one place, `connect.connect_gym`, which reads the validated environments file,
and hands in the values of `types.py`; it imports nothing else of this package. The rest is cut by what a reader asks:

- "How do we talk to a running Gym, whoever started it?" `over_http/`: the head server and where each agent's rows go
  (`client`), a batch run under a deadline (`collect`), optionally from child processes (`collect_processes`), the
  failure cause of a row (`outcomes`), liveness over HTTP of Gym's servers and of verl's policy servers (`health`), the
  HTTP connection limits from the file limit (`limits`), and `connection.GymConnection`, which composes them.
- "How do we own a Gym process tree?" `owned/`: Gym's Python environment (`environment`), the rules of Gym's the
  plugin mirrors to start it (`gym_layout`), the config it is handed (`global_config`), `launch.OwnedGym` (start,
  supervise, stop), its processes (`processes`) and their liveness (`liveness`).
- "How do we use a Gym someone else started?" `attach.AttachedGym`, with `relay.PolicyRelay` in front of several
  policy servers.
- `watchdog`, which kills what either started (an owned Gym's process tree, an attached Gym's relay) when the
  trainer dies without a word.
- `OwnedGym` and `AttachedGym` each hold a `GymConnection` (composition: the health check of Gym's servers is
  handed to it); `exit_hooks` stops what each one owns when the trainer exits; `errors` holds their error types.

Nothing is imported here, so that importing one module (the launcher's checks need only `owned.environment`; a
collect process only `over_http`) loads no other.
"""
