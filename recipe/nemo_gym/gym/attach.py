# SPDX-License-Identifier: Apache-2.0
"""`AttachedGym`: a NeMo Gym someone else started (CPU nodes, another Slurm job), used over HTTP only.

The plugin starts, signals and stops no process of an attached Gym: the trainer's exit, however it happens
(SIGKILL included), leaves it running for the next trainer.

Contract:
- `AttachedGym.attach(spec, loop=...)` waits, within `spec.startup_timeout_s`, until the head server at
  `spec.head_server_url` lists its servers and every one answers HTTP (Gym may still be starting when the trainer
  is). It then reads the configuration and refuses, naming the key and the fix (`GymConfigError`), one whose
  rows could not be run, scored (`connection.GymConnection._adopt`) or trained on (`policy_handover`): the policy
  model server must exist, have an `endpoint_file` (Gym 0.7's `vllm_model`; absolute, or `spec.endpoint_file`
  given), return token IDs, and ask for the model verl serves.
- Policy handover: verl's servers exist only once the trainer runs, so their address goes to Gym through that
  endpoint file, which Gym's model server re-reads when it changes (`publish_endpoint`: written whole, renamed
  into place). With one verl server, its URL; with several (the file holds one URL), the URL of a
  `relay.PolicyRelay` the plugin runs on `loop`, at `spec.relay_host` (`relay_port`). The first batch waits
  until Gym's model server has looked at the file again (`endpoint_check_interval_s` of its config).
- The Gym's release cannot be read over HTTP (no server reports it). Attach mode needs what only 0.7's API has:
  the head server's `/readyz` and the model server's `endpoint_file`; `version` says "0.7 (by its API)".
- While a batch waits, each Gym server gets `GET /` (`RemoteServerWatch`): `spec.health_failures` consecutive
  probes without an answer abort the batch naming the server (its processes are on other nodes).
- `shutdown()` stops the relay, empties the endpoint file if it still holds this trainer's URL (Gym then reports
  the policy as unpublished instead of retrying a dead address), and closes the HTTP session. Idempotent; also run
  at interpreter exit. Nothing else: no Gym process is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym.client import HeadClient, get_json
from recipe.nemo_gym.gym.connection import GymConnection
from recipe.nemo_gym.gym.errors import GymConfigError, GymServerDied, GymStartTimeout
from recipe.nemo_gym.gym.health import FailureStreaks, probe_http, wait_until_answering
from recipe.nemo_gym.gym.processes import LIVE, LIVE_LOCK, install_exit_hooks
from recipe.nemo_gym.gym.relay import PolicyRelay
from recipe.nemo_gym.gym.spec import ServerInstance

logger = logging.getLogger(__name__)

MODEL_SERVER_TYPE = "responses_api_models"
_POLL_S = 2.0
# Gym 0.7's `vllm_model` default for how long it trusts its last look at the endpoint file.
_DEFAULT_ENDPOINT_CHECK_INTERVAL_S = 10.0


@dataclass(frozen=True)
class AttachSpec:
    """Everything needed to use one attached NeMo Gym (from `nemo_gym.attach` and the policy servers verl runs)."""

    head_server_url: str
    policy_base_urls: tuple[str, ...]
    policy_model_name: str
    policy_model_server: str = "policy_model"
    endpoint_file: Path | None = None
    relay_host: str = "127.0.0.1"
    relay_port: int = 0
    overrides: Mapping[str, Any] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    health_timeout_s: float = 10.0
    health_failures: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy_base_urls", tuple(self.policy_base_urls))
        object.__setattr__(self, "overrides", dict(self.overrides))  # a copy: the caller may change its own
        if not self.policy_base_urls:
            raise GymConfigError("AttachSpec.policy_base_urls is empty: give verl's policy servers' base URLs")
        parts = urlsplit(self.head_server_url)
        if parts.scheme != "http" or not parts.hostname:
            raise GymConfigError(f"nemo_gym.attach.head_server_url: {self.head_server_url!r} is not http://host:port")

    @classmethod
    def from_config(
        cls, plugin_config: Any, policy_base_urls: Sequence[str], policy_model_name: str, node_ip: str
    ) -> AttachSpec:
        """The spec for the plugin's validated YAML (`NeMoGymConfig` with `nemo_gym.attach`); `node_ip` is where
        Gym reaches this trainer's relay unless `relay_host` says otherwise. Gym's servers are probed with the
        policy servers' health settings."""
        attach, timeouts = plugin_config.nemo_gym.attach, plugin_config.timeouts
        return cls(
            head_server_url=attach.head_server_url.rstrip("/"),
            policy_base_urls=tuple(policy_base_urls),
            policy_model_name=policy_model_name,
            policy_model_server=attach.policy_model_server,
            endpoint_file=attach.endpoint_file,
            relay_host=attach.relay_host or node_ip,
            relay_port=attach.relay_port,
            startup_timeout_s=timeouts.startup_s,
            health_timeout_s=timeouts.policy_health_timeout_s,
            health_failures=timeouts.policy_health_failures,
        )

    @property
    def head(self) -> tuple[str, int]:
        parts = urlsplit(self.head_server_url)
        return str(parts.hostname), int(parts.port or 80)


# ------------------------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class PolicyHandover:
    """Where verl's policy address goes: the model server's endpoint file, and how often Gym looks at it."""

    server: str
    endpoint_file: Path
    check_interval_s: float


def _resolved(value: Any, config: Mapping[str, Any]) -> Any:
    """A top-level `${key}` interpolation as Gym resolves it (the head server sends the config unresolved)."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return config.get(value[2:-1], value)
    return value


def policy_handover(
    config: Mapping[str, Any],
    server: str,
    served_model_name: str,
    endpoint_file: Path | None = None,
) -> PolicyHandover:
    """Check that `server` of an attached Gym's configuration can be handed verl's policy (pure).

    Raises `GymConfigError` listing every problem with the Gym command-line setting that fixes it.
    """
    entry = config.get(server)
    models = entry.get(MODEL_SERVER_TYPE) if isinstance(entry, Mapping) else None
    if not isinstance(models, Mapping) or len(models) != 1:
        available = sorted(k for k, v in config.items() if isinstance(v, Mapping) and MODEL_SERVER_TYPE in v)
        raise GymConfigError(
            f"the attached NeMo Gym has no model server {server!r} (its model servers: {available}); set "
            "nemo_gym.attach.policy_model_server to the one that serves the policy"
        )
    implementation, settings = next(iter(models.items()))
    key = f"{server}.{MODEL_SERVER_TYPE}.{implementation}"
    if "endpoint_file" not in settings:
        raise GymConfigError(
            f"the attached NeMo Gym's model server {server!r} ({implementation}) has no endpoint_file setting, so "
            "it cannot be handed verl's policy address: attach mode needs NeMo Gym 0.7's vllm_model"
        )
    problems = []
    configured = settings.get("endpoint_file")
    if endpoint_file is None:
        if not configured:
            problems.append(f"start Gym with ++{key}.endpoint_file=<a path on a file system both jobs see>")
        elif not Path(str(configured)).is_absolute():
            problems.append(
                f"{key}.endpoint_file is {configured!r}, relative to Gym's folder: give an absolute path, or set "
                "nemo_gym.attach.endpoint_file to where this trainer sees it"
            )
        else:
            endpoint_file = Path(str(configured))
    if not settings.get("return_token_id_information"):
        problems.append(
            f"{key}.return_token_id_information is not true: Gym would not return the token IDs verl trains on "
            "(start it with vllm_model_for_training.yaml)"
        )
    model = _resolved(settings.get("model"), config)
    if model != served_model_name:
        problems.append(
            f"{key}.model is {model!r} but verl serves {served_model_name!r}: start Gym with "
            f"+policy_model_name={served_model_name}"
        )
    if problems:
        raise GymConfigError(f"the attached NeMo Gym cannot be handed verl's policy: {'; '.join(problems)}")
    assert endpoint_file is not None
    interval = settings.get("endpoint_check_interval_s", _DEFAULT_ENDPOINT_CHECK_INTERVAL_S)
    return PolicyHandover(server, endpoint_file, float(interval))


def publish_endpoint(path: Path, url: str) -> None:
    """Write `url` to `path` whole: a reader sees the old content or the new, never part of it."""
    if not path.parent.is_dir():
        raise GymConfigError(
            f"the endpoint file's folder {path.parent} does not exist on this node: is the file system Gym reads "
            "it from mounted here at the same path? If not, set nemo_gym.attach.endpoint_file to where it is"
        )
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(url + "\n")
    os.replace(staged, path)


class RemoteServerWatch:
    """Consecutive unanswered `GET /` probes per Gym server, for one batch (`FailureStreaks`); `max_failures` in a
    row raise `GymServerDied` naming the server, its URL and the last reason. An answer resets the count."""

    def __init__(self, servers: Sequence[ServerInstance], timeout_s: float, max_failures: int):
        self.servers = [s for s in servers if s.url]
        self.timeout_s = timeout_s
        self.streaks = FailureStreaks([s.name for s in self.servers], max_failures)

    @property
    def failures(self) -> dict[str, int]:
        return self.streaks.counts

    def record(self, results: Sequence[tuple[ServerInstance, bool, str]]) -> None:
        last = {server.name: (server, detail) for server, _, detail in results}
        for server, alive, _ in results:
            self.streaks.record(server.name, alive, 0.0)
        names = [name for name in self.streaks.over_limit() if name in last]
        if names:
            dead = [
                f"NeMo Gym server {name!r} at {last[name][0].url} did not answer {self.streaks.counts[name]} "
                f"health checks in a row (last: {last[name][1]})"
                for name in names
            ]
            raise GymServerDied("\n".join(dead) + " (the attached Gym runs elsewhere: see its own logs)", names)

    async def check(self) -> None:
        answers = await asyncio.gather(*(probe_http(f"{s.url}/", self.timeout_s) for s in self.servers))
        self.record([(s, alive, detail) for s, (alive, detail) in zip(self.servers, answers, strict=True)])


# ------------------------------------------------------------------------------------------- the connection


class AttachedGym(GymConnection):
    """A NeMo Gym started elsewhere. Build with `AttachedGym.attach(spec, loop=...)`; `shutdown()` leaves it up."""

    def __init__(self, spec: AttachSpec, loop: BackgroundLoop):
        super().__init__(
            loop,
            overrides=spec.overrides,
            policy_base_urls=spec.policy_base_urls,
            policy_health_timeout_s=spec.health_timeout_s,
            policy_health_failures=spec.health_failures,
        )
        self.spec = spec
        self.handover: PolicyHandover | None = None
        self.published_url: str | None = None
        self.relay: PolicyRelay | None = None
        self._watch: RemoteServerWatch | None = None
        self._first_batch_after = 0.0

    @property
    def version(self) -> str | None:
        return "0.7 (by its API)"

    @classmethod
    def attach(cls, spec: AttachSpec, *, loop: BackgroundLoop) -> AttachedGym:
        gym = cls(spec, loop)
        with LIVE_LOCK:
            LIVE.add(gym)
        install_exit_hooks()
        try:
            gym._attach()
        except BaseException:
            gym.shutdown()
            raise
        return gym

    def _attach(self) -> None:
        t0 = time.monotonic()
        spec = self.spec
        host, port = spec.head
        head = HeadClient(host, port, timeout_s=5.0)
        servers = self._wait_until_answering(head, deadline=t0 + spec.startup_timeout_s)
        status, _ = get_json(host, port, "/readyz", 5.0)
        if status == 404:
            raise GymConfigError(
                f"the NeMo Gym at {spec.head_server_url} has no /readyz: it predates 0.7, and attach mode needs 0.7 "
                "(its model server's endpoint_file). Run Gym 0.7, or let the plugin start Gym (remove nemo_gym.attach)"
            )
        config = head.config()
        self._adopt(config, servers, spec.head_server_url)
        self.handover = policy_handover(config, spec.policy_model_server, spec.policy_model_name, spec.endpoint_file)
        url = spec.policy_base_urls[0]
        if len(spec.policy_base_urls) > 1:
            self.relay = PolicyRelay(spec.policy_base_urls)
            bound = self.loop.run(self.relay.start(spec.relay_host, spec.relay_port), timeout=30.0, what="relay")
            url = f"http://{spec.relay_host}:{bound}/v1"
        publish_endpoint(self.handover.endpoint_file, url)
        self.published_url = url
        # Gym's model server trusts its last look at the file this long: rows sent sooner could reach the address
        # a previous trainer published.
        self._first_batch_after = time.monotonic() + self.handover.check_interval_s
        self._watch = RemoteServerWatch(self.servers, spec.health_timeout_s, spec.health_failures)
        self.startup_s = time.monotonic() - t0
        relay = f" through a relay to {list(spec.policy_base_urls)}" if self.relay else ""
        logger.warning(
            "Attached to NeMo Gym at %s (%d servers); policy %s published in %s%s",
            spec.head_server_url, len(self.servers), url, self.handover.endpoint_file, relay,
        )  # fmt: skip

    def _wait_until_answering(self, head: HeadClient, deadline: float) -> list[ServerInstance]:
        waited: list[bool] = []

        def say_once(_: list[ServerInstance]) -> None:
            if not waited:
                logger.warning("Waiting for the NeMo Gym at %s to list its servers", self.spec.head_server_url)
                waited.append(True)

        servers, not_ready = wait_until_answering(head, deadline, _POLL_S, say_once)
        if not servers or not_ready:
            what = f"servers not answering HTTP: {not_ready}" if servers else "its head server did not answer"
            raise GymStartTimeout(
                f"the NeMo Gym at {self.spec.head_server_url} was not ready within "
                f"{self.spec.startup_timeout_s:g}s ({what}). Is it started, and reachable from this node? "
                "(Gym binds its servers to 127.0.0.1 unless started with +use_absolute_ip=true)",
                not_ready or ["head_server"],
            )
        return servers

    async def _check_gym(self) -> None:
        assert self._watch is not None
        await self._watch.check()

    async def collect(self, examples, deadline_s, health_check_interval_s, **retry):  # noqa: D102 - see GymConnection
        wait = self._first_batch_after - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        return await super().collect(examples, deadline_s, health_check_interval_s, **retry)

    def shutdown(self) -> None:
        """Stop the relay, unpublish the policy, close the session. No Gym process is touched. Idempotent."""
        if not self._claim_stop():
            return
        try:
            if self.relay is not None and not self.loop.closed:
                with contextlib.suppress(Exception):
                    self.loop.run(self.relay.close(), timeout=5.0, what="stopping the policy relay")
            self._unpublish()
            self._close_session()
        finally:
            self._forget()

    def kill_now(self) -> None:
        """On SIGTERM of this process: nothing of Gym's to kill; unpublish the policy (a dead address)."""
        if not self._claim_stop():
            return
        self._unpublish()
        self._forget()

    def _unpublish(self) -> None:
        if self.handover is None or self.published_url is None:
            return
        path = self.handover.endpoint_file
        with contextlib.suppress(OSError, GymConfigError):
            if path.read_text().strip() == self.published_url:
                publish_endpoint(path, "")
