# SPDX-License-Identifier: Apache-2.0
"""`AttachedGym`: a NeMo Gym someone else started (CPU nodes, another Slurm job), used over HTTP only.

The plugin starts, signals and stops no process of an attached Gym: the trainer's exit, however it happens
(SIGKILL included), leaves it running for the next trainer.

Contract:
- `AttachedGym.attach(config, policy, loop=..., relay_host=...)` takes the validated environments file
  (`nemo_gym.attach`, `timeouts`) and verl's policy servers. It waits, within `timeouts.startup_s`, until the head
  server at `attach.head_server_url` lists its servers and every one answers HTTP (Gym may still be starting when the
  trainer is). It then reads the configuration and refuses, naming the key and the fix (`GymConfigError`), one whose
  rows could not be run, scored (`GymConnection.adopt`) or trained on (`policy_handover`): the policy model
  server must exist, have an `endpoint_file` (Gym 0.7's `vllm_model`; absolute, or `attach.endpoint_file` given),
  return token IDs, and ask for the model verl serves. Rows then reach it through `connection`
  (`over_http.connection.GymConnection`).
- Policy handover: verl's servers exist only once the trainer runs, so their address goes to Gym through that
  endpoint file, which Gym's model server re-reads when it changes (`publish_endpoint`: written whole, renamed
  into place). With one verl server, its URL; with several (the file holds one URL), the URL of a
  `relay.PolicyRelay` the plugin runs on `loop`, at `attach.relay_host` (else `relay_host`, the trainer node's
  address), on `attach.relay_port`. The first batch waits
  until Gym's model server has looked at the file again (`endpoint_check_interval_s` of its config).
- The Gym's release cannot be read over HTTP (no server reports it). Attach mode needs what only 0.7's API has:
  the head server's `/readyz` and the model server's `endpoint_file`; `version` says "0.7 (by its API)".
- While a batch waits, each Gym server gets `GET /` (`health.RemoteServerWatch`): `timeouts.policy_health_failures`
  consecutive probes without an answer abort the batch naming the server (its processes are on other nodes).
- `shutdown()` stops the relay, empties the endpoint file if it still holds this trainer's URL (Gym then reports
  the policy as unpublished instead of retrying a dead address), and closes the connection. Idempotent; also run
  at interpreter exit, and `kill_now()` (the unpublishing) on SIGTERM (`exit_hooks.py`). Nothing else: no Gym
  process is touched. A trainer that dies before any of these runs (SIGKILL; Ray SIGKILLs its TaskRunner about
  0.1 s after SIGTERM) has its address withdrawn all the same, by an `watchdog.Watchdog` started before the
  address was published (`clear_on_exit`), which empties the file if it still holds that address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recipe.nemo_gym.config import NeMoGymConfig
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.gym import exit_hooks
from recipe.nemo_gym.gym.errors import GymConfigError, GymStartTimeout
from recipe.nemo_gym.gym.over_http.client import HeadClient, ServerInstance, get_json
from recipe.nemo_gym.gym.over_http.connection import GymConnection
from recipe.nemo_gym.gym.over_http.health import RemoteServerWatch, wait_until_answering
from recipe.nemo_gym.gym.over_http.limits import ConnectionLimits
from recipe.nemo_gym.gym.relay import PolicyRelay
from recipe.nemo_gym.gym.types import PolicyServers
from recipe.nemo_gym.gym.watchdog import Watchdog

logger = logging.getLogger(__name__)

MODEL_SERVER_TYPE = "responses_api_models"
_POLL_S = 2.0
# Gym 0.7's `vllm_model` default for how long it trusts its last look at the endpoint file.
_DEFAULT_ENDPOINT_CHECK_INTERVAL_S = 10.0
SESSION_ID_SETTING = "forward_session_id_as_conversation_id"  # vllm_model's: each call names its episode


# ------------------------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class PolicyHandover:
    """Where verl's policy address goes: the model server's endpoint file, and how often Gym looks at it."""

    server: str
    endpoint_file: Path
    check_interval_s: float
    session_affinity_setting: str | None = None
    """Unset when Gym sends each call's episode (its session) as a conversation id, which the relay keeps on one
    server; else the Gym setting that turns it on (`forward_session_id_as_conversation_id`, Gym 0.7.0)."""


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
    affinity = None if settings.get(SESSION_ID_SETTING) else f"++{key}.{SESSION_ID_SETTING}=true"
    return PolicyHandover(server, endpoint_file, float(interval), affinity)


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


# ------------------------------------------------------------------------------------------- the connection


class AttachedGym:
    """A NeMo Gym started elsewhere. Build with `AttachedGym.attach(...)`; `shutdown()` leaves it up."""

    version = "0.7 (by its API)"
    """The nemo-gym release running: attach mode needs 0.7's API, and no server reports the release."""

    def __init__(self, config: NeMoGymConfig, policy: PolicyServers, loop: BackgroundLoop, relay_host: str):
        assert config.nemo_gym.attach is not None
        self.settings = config.nemo_gym.attach
        self.timeouts = config.timeouts
        self.policy = policy
        self.loop = loop  # borrowed: the caller created it and closes it, after `shutdown()`
        self.relay_host = self.settings.relay_host or relay_host
        self.head_server_url = self.settings.head_server_url.rstrip("/")
        self.connection: GymConnection | None = None
        self.startup_s: float | None = None
        self.handover: PolicyHandover | None = None
        self.published_url: str | None = None
        self.relay: PolicyRelay | None = None
        self._watchdog: Watchdog | None = None
        self._stop = exit_hooks.StopOnce()

    @classmethod
    def attach(
        cls,
        config: NeMoGymConfig,
        policy: PolicyServers,
        *,
        loop: BackgroundLoop,
        relay_host: str = "127.0.0.1",
        limits: ConnectionLimits | None = None,
    ) -> AttachedGym:
        """`relay_host`: where Gym reaches this trainer's relay unless `nemo_gym.attach.relay_host` says otherwise
        (the trainer node's address). `limits` bound the connection's HTTP session."""
        gym = cls(config, policy, loop, relay_host)
        exit_hooks.register(gym)
        try:
            gym._attach(limits.as_overrides() if limits is not None else {})
        except BaseException:
            gym.shutdown()
            raise
        return gym

    def _attach(self, connector_limits: Mapping[str, Any]) -> None:
        t0 = time.monotonic()
        parts = urlsplit(self.head_server_url)
        host, port = str(parts.hostname), int(parts.port or 80)
        head = HeadClient(host, port, timeout_s=5.0)
        servers = self._wait_until_answering(head, deadline=t0 + self.timeouts.startup_s)
        status, _ = get_json(host, port, "/readyz", 5.0)
        if status == 404:
            raise GymConfigError(
                f"the NeMo Gym at {self.head_server_url} has no /readyz: it predates 0.7, and attach mode needs 0.7 "
                "(its model server's endpoint_file). Run Gym 0.7, or let the plugin start Gym (remove nemo_gym.attach)"
            )
        gym_config = head.config()
        watch = RemoteServerWatch(servers, self.timeouts.policy_health_timeout_s, self.timeouts.policy_health_failures)
        self.connection = GymConnection.adopt(
            self.loop,
            gym_config,
            servers,
            self.head_server_url,
            policy=self.policy,
            timeouts=self.timeouts,
            check_gym=watch.check,
            connector_limits=connector_limits,
        )
        settings = self.settings
        self.handover = policy_handover(
            gym_config, settings.policy_model_server, self.policy.model_name, settings.endpoint_file
        )
        urls = self.policy.base_urls
        url = urls[0]
        if len(urls) > 1:
            if self.handover.session_affinity_setting:
                logger.warning(
                    "The attached NeMo Gym does not say which episode each model call belongs to, so the relay in "
                    "front of verl's %d servers cannot keep an episode's calls on one server (its prefix cache): "
                    "start Gym with %s",
                    len(urls), self.handover.session_affinity_setting,
                )  # fmt: skip
            self.relay = PolicyRelay(urls)
            bound = self.loop.run(self.relay.start(self.relay_host, settings.relay_port), timeout=30.0, what="relay")
            url = f"http://{self.relay_host}:{bound}/v1"
        # Started before the address is published, so that no moment has it published and unwatched: a trainer that
        # dies without a word (a Ray actor SIGKILLed before its SIGTERM hook runs) still has it withdrawn.
        self._watchdog = Watchdog.spawn()
        publish_endpoint(self.handover.endpoint_file, url)
        self.published_url = url
        self._watchdog.clear_on_exit(str(self.handover.endpoint_file), url)
        # Gym's model server trusts its last look at the file this long: rows sent sooner could reach the address
        # a previous trainer published.
        self.connection.not_before = time.monotonic() + self.handover.check_interval_s
        self.startup_s = time.monotonic() - t0
        relay = f" through a relay to {list(urls)}" if self.relay else ""
        logger.warning(
            "Attached to NeMo Gym at %s (%d servers); policy %s published in %s%s",
            self.head_server_url, len(servers), url, self.handover.endpoint_file, relay,
        )  # fmt: skip

    def _wait_until_answering(self, head: HeadClient, deadline: float) -> list[ServerInstance]:
        waited: list[bool] = []

        def say_once(_: list[ServerInstance]) -> None:
            if not waited:
                logger.warning("Waiting for the NeMo Gym at %s to list its servers", self.head_server_url)
                waited.append(True)

        servers, not_ready = wait_until_answering(head, deadline, _POLL_S, say_once)
        if not servers or not_ready:
            what = f"servers not answering HTTP: {not_ready}" if servers else "its head server did not answer"
            raise GymStartTimeout(
                f"the NeMo Gym at {self.head_server_url} was not ready within "
                f"{self.timeouts.startup_s:g}s ({what}). Is it started, and reachable from this node? "
                "(Gym binds its servers to 127.0.0.1 unless started with +use_absolute_ip=true)",
                not_ready or ["head_server"],
            )
        return servers

    def shutdown(self) -> None:
        """Stop the relay, unpublish the policy, close the connection. No Gym process is touched. Idempotent."""
        if not self._stop.claim():
            return
        if self.connection is not None:
            self.connection.closed = True  # no batch starts from here on; the session is closed last
        try:
            if self.relay is not None and not self.loop.closed:
                with contextlib.suppress(Exception):
                    self.loop.run(self.relay.close(), timeout=5.0, what="stopping the policy relay")
            self._unpublish()
            if self.connection is not None:
                self.connection.close()
        finally:
            self._release_watchdog()
            exit_hooks.forget(self)

    def kill_now(self) -> None:
        """On SIGTERM of this process: nothing of Gym's to kill; unpublish the policy (a dead address)."""
        if not self._stop.claim():
            return
        self._unpublish()
        if self.connection is not None:
            self.connection.closed = True  # no batch after this; the session is not touched in a signal handler
        self._release_watchdog()
        exit_hooks.forget(self)

    def _release_watchdog(self) -> None:
        """The address is unpublished already: the watchdog finds the file no longer ours and exits."""
        if self._watchdog is not None:
            self._watchdog.release()

    def _unpublish(self) -> None:
        if self.handover is None or self.published_url is None:
            return
        path = self.handover.endpoint_file
        with contextlib.suppress(OSError, GymConfigError):
            if path.read_text().strip() == self.published_url:
                publish_endpoint(path, "")
