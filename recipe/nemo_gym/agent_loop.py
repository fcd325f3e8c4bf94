# SPDX-License-Identifier: Apache-2.0
"""`NeMoGymAgentLoopManager`: verl 0.9.1's agent loop manager, with NeMo Gym running every episode.

Loaded by verl's trainer (`trainer.use_v1=false`) through
`actor_rollout_ref.rollout.agent.agent_loop_manager_class=recipe.nemo_gym.agent_loop.NeMoGymAgentLoopManager`
and created with verl's own call `create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)`.

Contract with verl (see the README, "How it works"):
- `create` reads the environments file at `actor_rollout_ref.rollout.agent.agent_loop_config_path`, finds the vLLM
  servers verl already launched and the model name they serve, and connects to NeMo Gym (`gym/connect.py`): it
  starts Gym from its own Python environment (`nemo_gym.environment`) as a process tree of its own, offline, with
  its own Ray, within `timeouts.startup_s` (`gym/owned/launch.py`); or, with `nemo_gym.attach`, uses a NeMo Gym
  started elsewhere and hands it the policy's address (`gym/attach.py`). This process imports no NeMo Gym module:
  it speaks to Gym over HTTP.
  Then every row of `data.train_files` and `data.val_files` is checked against the agents Gym serves
  (`data_check.py`, `data.check_rows`): all bad rows are raised at once, before step 1.
  Any failure stops everything it started and raises.
- `generate_sequences(prompts)` takes verl's batch (non-tensor rows from `NeMoGymJSONLDataset`, each prompt
  repeated `rollout.n` times) and returns a `DataProto` of the same length and row order: `prompts`,
  `responses`, `response_mask` (1 only on policy-generated tokens), `input_ids`, `attention_mask`,
  `position_ids`, `rollout_log_probs`, `rm_scores` (NeMo Gym's reward), `multi_modal_inputs`,
  `__num_turns__`, `meta_info["timing"]`. Every HTTP request has finished when it returns (verl puts the vLLM
  servers to sleep right after). Rows marked `__do_sample__=False` (REMAX's baseline) go out greedy, as in
  verl's own agent loop (`rollout_requests.py`).
- Validation (`meta_info["validate"]`): each real episode runs once. verl pads the batch to a multiple of
  `rollout.agent.num_workers` with copies of its leading rows; those rows are not run but filled with copies of
  the packed rows they duplicate (`rollout_requests.real_rows`), and the trainer drops them. verl's `_validate`
  reads no `meta_info["timing"]`, so failures also travel as per-episode fields in `reward_extra_keys`: `acc`,
  the reward of each episode that did not fail (verl's `val-core/<data_source>/acc/mean@N`), and
  `val-aux/<data_source>/nemo_gym/failed/mean@N` (see `metrics.py`), plus a warning counting them by cause.
- The batch is bounded by `timeouts.batch_s`, and the servers are health-checked while it waits: a dead server
  or an expired deadline raises `RolloutAborted` naming the server or the pending count. An episode that fails
  for an infrastructure cause is run again up to `failures.retries` times in the same batch; what still fails is
  masked and counted (`failures.py`), and past `failures.max_fraction` the step fails with a summary.
- A failed episode changes no statistic: with `algorithm.adv_estimator=nemo_gym_grpo` (or another failure-aware
  estimator, registered when the manager is built: `advantages.py`) it is left out of its group's baseline, and
  verl's `critic/score/*` leaves it out (`packing/batch.py`). A plain verl group estimator gets a warning.
- Several reward components: an environment's `reward_components` reach the metrics per environment
  (`timing_s/nemo_gym/<env>/reward_component/<name>/mean`). Under verl's GDPO (`algorithm.adv_estimator=gdpo`,
  `algorithm.gdpo_reward_keys=[...]`) each batch also carries the named components per row, which GDPO
  normalizes one by one; a result without one fails as BAD_REWARD. GDPO is not failure-aware: verl hands its
  extra inputs to no other estimator name, so a failed row's components (0) enter its group's normalization, and
  the plain-estimator warning says so.
- All NeMo Gym calls run on one event loop this manager owns (the connection's aiohttp session is bound to the
  loop it was made on, and verl's `create` runs on a loop that is closed right after). It is the only
  `BackgroundLoop` in production: the Gym's `GymConnection` borrows it, and its `collect` is awaited on it
  (`generate_sequences`). With `nemo_gym.collect_processes: N`, N child processes post the rows and read each result
  into its `Episode` (`gym/over_http/collect_processes.py`); the loop keeps the routing, retries, deadline and
  health checks, and packs what they send back.

Environment metrics reach the user's loggers through `meta_info["timing"]`, the one dict verl 0.9.1 copies
from the rollout into the step's logged metrics: they appear as `timing_s/nemo_gym/...` (see `metrics.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from typing import Any

import numpy as np
from verl import DataProto
from verl.utils.ray_utils import auto_await

from recipe.nemo_gym.advantages import (
    FAILURE_AWARE,
    loss_agg_mode_warning,
    plain_estimator_warning,
    register_failure_aware_estimators,
)
from recipe.nemo_gym.config import NeMoGymConfig, load_config
from recipe.nemo_gym.data_check import DataFilesError, check_data_files, configured_files
from recipe.nemo_gym.dataset import ROW_KEY, prompt_messages
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.event_loop import BackgroundLoop
from recipe.nemo_gym.failures import EpisodeFailure, FailureBudget
from recipe.nemo_gym.gym.connect import Gym, connect_gym
from recipe.nemo_gym.gym.types import CollectSettings, PolicyServers
from recipe.nemo_gym.metrics import (
    PREFIX as METRICS_PREFIX,
)
from recipe.nemo_gym.metrics import (
    VALIDATION_FAILED_KEY,
    VALIDATION_SCORE_KEY,
    describe_failures,
    environment_metrics,
    validation_extra_info,
)
from recipe.nemo_gym.packing.batch import BatchPacker
from recipe.nemo_gym.packing.episode import Episode, read_episode
from recipe.nemo_gym.packing.stats import PackStats
from recipe.nemo_gym.rollout_requests import DO_SAMPLE_KEY, build_example, real_rows, row_samplings
from recipe.nemo_gym.row_agents import row_agents
from recipe.nemo_gym.verl_servers import discover_policy_servers

logger = logging.getLogger(__name__)
PLUGIN_LOGGER = "recipe.nemo_gym"
LOG_LEVEL_ENV = "NEMO_GYM_VERL_LOGGING_LEVEL"


def configure_plugin_logging() -> None:
    """Give the plugin's loggers a stderr handler of their own (level `$NEMO_GYM_VERL_LOGGING_LEVEL`, default
    WARNING), as verl does for its own (`verl.utils.logging_utils.configure_verl_logging`).

    Why: in verl's TaskRunner, where the manager runs, the root logger drops WARNING records. vLLM's API server
    (0.24) imports `model_hosting_container_standards` (0.1.16), whose import sets the root logger and its handlers
    to ERROR unless `LOG_LEVEL` or `SAGEMAKER_CONTAINER_LOG_LEVEL` is set (vllm-project/vllm#53655). Without this
    handler the progress lines and the start-up summary never reached the job's output
    (tests/cpu/unit/test_plugin_logging.py). Idempotent; called when the manager is built, not at import."""
    plugin = logging.getLogger(PLUGIN_LOGGER)
    if any(getattr(h, "_nemo_gym_plugin", False) for h in plugin.handlers):
        return
    handler = logging.StreamHandler(stream=sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(asctime)s:%(message)s"))  # verl's format
    handler._nemo_gym_plugin = True  # type: ignore[attr-defined]  # marks ours, for idempotence
    plugin.addHandler(handler)
    plugin.setLevel(os.environ.get(LOG_LEVEL_ENV, "WARNING"))
    plugin.propagate = False


class NeMoGymAgentLoopManager:
    def __init__(
        self,
        config,
        llm_client,
        teacher_client=None,
        reward_loop_worker_handles=None,
    ):
        if teacher_client:
            raise ConfigError(
                "NeMoGymAgentLoopManager does not support teacher models (distillation): NeMo Gym runs the "
                "episode and its environment gives the reward. Remove the teacher configuration."
            )
        # reward_loop_worker_handles are ignored on purpose: the environment's reward is the reward.
        configure_plugin_logging()
        self.config = config
        self.rollout_config = config.actor_rollout_ref.rollout
        path = self.rollout_config.agent.get("agent_loop_config_path")
        if not path:
            raise ConfigError("actor_rollout_ref.rollout.agent.agent_loop_config_path must name the environments file")
        self.config_path = str(path)
        self.plugin_config: NeMoGymConfig = load_config(path)
        self.llm_client = llm_client
        self.budget = FailureBudget(self.plugin_config.failures.max_fraction)
        self.adv_estimator = _adv_estimator(config)
        self.gdpo_reward_keys = _gdpo_reward_keys(config, self.adv_estimator)
        # verl computes advantages in this process (the TaskRunner): the failure-aware estimators must be known here.
        register_failure_aware_estimators(self.plugin_config.failures.min_valid_per_group)
        if (warning := plain_estimator_warning(self.adv_estimator)) is not None:
            logger.warning("NeMo Gym: %s (recipe/nemo_gym/advantages.py)", warning)
        loss_agg_mode = config.actor_rollout_ref.get("actor", {}).get("loss_agg_mode", "")
        if (warning := loss_agg_mode_warning(loss_agg_mode)) is not None:
            logger.warning("NeMo Gym: %s (recipe/nemo_gym/advantages.py)", warning)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.tokenizer = _tokenizer(config)
        self.pad_token_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        self._loop: BackgroundLoop | None = None
        self._gym: Gym | None = None
        self.agent_names: frozenset[str] = frozenset()
        # Results are read into episodes by collect processes when the environments file asks for them.
        processes = self.plugin_config.nemo_gym.collect_processes
        self.reading = (
            CollectSettings(processes, self.prompt_length, tuple(self.gdpo_reward_keys)) if processes else None
        )
        # The last batch's raw NeMo Gym results (with collect processes: their episodes) and packing statistics, for
        # inspection (the demo writes them out).
        self.last_results: list[dict[str, Any] | Episode | EpisodeFailure] = []
        self.last_stats: PackStats | None = None

    @classmethod
    def create(cls, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        """verl's entry point: build the manager and start NeMo Gym (blocking; bounded by `timeouts.startup_s`)."""
        manager = cls(config, llm_client, teacher_client, reward_loop_worker_handles)
        manager.start()
        return manager

    def start(self) -> None:
        timeouts = self.plugin_config.timeouts
        self._loop = BackgroundLoop(name="nemo-gym")
        try:
            base_urls, model_name = self._loop.run(
                discover_policy_servers(self.llm_client, deadline_s=timeouts.startup_s),
                timeout=timeouts.startup_s,
                what="finding verl's vLLM servers",
            )
            policy = PolicyServers(tuple(base_urls), model_name)
            self._gym = connect_gym(self.plugin_config, policy, loop=self._loop, node_ip=_node_ip)
            self.agent_names = self._gym.connection.agent_names
            if self.plugin_config.data.check_rows:
                self._check_data_files()
        except BaseException:
            self.shutdown()
            raise
        logger.warning(
            "NeMo Gym %s ready in %.0f s: agents %s; policy %s at %s",
            self._gym.version,
            self._gym.startup_s or 0.0,
            sorted(self.agent_names),
            model_name,
            base_urls,
        )

    def _check_data_files(self) -> None:
        """Every row of verl's data files, before step 1 (`data_check.py`): all bad rows raised at once."""
        data = self.config.get("data") or {}
        paths, missing = configured_files(data)
        # In `main_ppo` verl's dataset has opened every file before this runs; a missing one means the manager runs
        # without verl's trainer (a benchmark, a test) and its config names verl's placeholder files.
        if missing:
            logger.warning("NeMo Gym: data files not found, not checked: %s", missing)
        if not paths:
            return
        started = time.perf_counter()
        agents = row_agents(data.get("default_agent_name"), self.plugin_config.nemo_gym)
        check = check_data_files(paths, self.agent_names, agents)
        if check.bad:
            raise DataFilesError(check, paths)
        logger.warning(
            "NeMo Gym: all %d rows of %s can run on the configured agents (checked in %.1f s; data.check_rows in %s)",
            check.rows,
            ", ".join(paths),
            time.perf_counter() - started,
            self.config_path,
        )

    def shutdown(self) -> None:
        """Stop every NeMo Gym server and the event loop; idempotent."""
        if self._gym is not None:
            self._gym.shutdown()
            self._gym = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        if self._loop is None or self._gym is None:
            raise RuntimeError("NeMoGymAgentLoopManager is shut down")
        return await self._loop.arun(self._generate(prompts))

    async def _generate(self, prompts: DataProto) -> DataProto:
        t_start = time.perf_counter()
        validate = bool(prompts.meta_info.get("validate", False))
        rows = prompts.non_tensor_batch[ROW_KEY]
        # Only the real rows run: a validation batch's padding (copies of its leading rows) is filled from them.
        n_real = len(rows)
        if validate:
            n_real = real_rows(
                prompts.non_tensor_batch.get("uid"),
                rows,
                n=int(self.rollout_config.val_kwargs.n),
                divisor=int(self.rollout_config.agent.num_workers),
            )
        samplings = row_samplings(
            self.rollout_config, prompts.meta_info, prompts.non_tensor_batch.get(DO_SAMPLE_KEY), n_real
        )
        examples = [build_example(rows[i], samplings[i]) for i in range(n_real)]

        packer = BatchPacker(
            n_real,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            pad_token_id=self.pad_token_id,
            component_keys=self.gdpo_reward_keys,
        )
        # The batch's output memory is first touched in a worker thread while NeMo Gym runs, not after it.
        prefaulted = asyncio.get_running_loop().run_in_executor(None, packer.prefault)
        timeouts, failure_settings = self.plugin_config.timeouts, self.plugin_config.failures
        attempts = [1] * n_real
        try:
            results = await self._gym.connection.collect(
                examples,
                deadline_s=timeouts.batch_s,
                health_check_interval_s=timeouts.health_check_interval_s,
                retries=failure_settings.retries,
                retry_delay_s=failure_settings.retry_delay_s,
                attempts=attempts,
                reading=self.reading,
                labels=_row_labels(prompts, n_real),
                config=self.config_path,
            )
        finally:
            await prefaulted
        t_collected = time.perf_counter()

        # Each episode is read and written into its row at once, so no episode's arrays outlive its row.
        sources = _data_sources(prompts, rows)
        failures: list[EpisodeFailure] = []
        for row, result in enumerate(results):
            outcome: Episode | EpisodeFailure
            if isinstance(result, Episode | EpisodeFailure):  # read by a collect process, or failed
                outcome = result
            else:
                outcome = read_episode(
                    result, row, max_prompt_length=self.prompt_length, required_components=self.gdpo_reward_keys
                )
            fallback = None
            if isinstance(outcome, EpisodeFailure):
                logger.warning("NeMo Gym episode failed and is masked: %s", outcome)
                failures.append(outcome)
                fallback = self._prompt_ids(rows[row])
            packer.add(row, outcome, fallback_prompt_ids=fallback, data_source=sources[row])
        self.last_results = results
        self.budget.check(failures, len(results))
        packed = packer.finish()
        t_packed = time.perf_counter()
        uids = prompts.non_tensor_batch.get("uid")
        stats = dataclasses.replace(
            packed.stats,
            attempts=np.asarray(attempts),
            uid=np.asarray(uids, dtype=object)[:n_real] if uids is not None and not validate else None,
        )
        self.last_stats = stats
        timing = {
            f"{METRICS_PREFIX}rollout_wait": t_collected - t_start,
            f"{METRICS_PREFIX}packing": t_packed - t_collected,
            f"{METRICS_PREFIX}packing_share": (t_packed - t_collected) / max(t_packed - t_start, 1e-9),
        }
        min_valid = failure_settings.min_valid_per_group if self.adv_estimator in FAILURE_AWARE else None
        timing.update(environment_metrics(stats, min_valid_per_group=min_valid))
        retried, recovered = timing[f"{METRICS_PREFIX}all/retried"], timing[f"{METRICS_PREFIX}all/recovered"]
        if retried:
            logger.warning(
                "NeMo Gym: %d of %d episodes were retried (failures.retries %d); %d recovered, %d failed again",
                retried,
                n_real,
                failure_settings.retries,
                recovered,
                retried - recovered,
            )
        output = packed.data
        if validate:
            # verl's _validate reads no timing: per-episode fields it aggregates per data_source carry failures.
            extra = validation_extra_info(stats)
            output.non_tensor_batch.update(extra)
            output.meta_info["reward_extra_keys"] = list(extra)
            if failures:
                logger.warning(
                    "NeMo Gym validation: %s; they are masked, left out of val-core/<data_source>/%s and counted in "
                    "val-aux/<data_source>/%s",
                    describe_failures(stats),
                    VALIDATION_SCORE_KEY,
                    VALIDATION_FAILED_KEY,
                )
        if n_real < len(rows):
            # Padded row i is a copy of row i mod n_real (verl's pad_dataproto_to_divisor); the trainer drops it.
            output = output.select_idxs(np.arange(len(rows)) % n_real)
        output.meta_info["timing"] = timing
        return output

    def _prompt_ids(self, row) -> list[int] | None:
        """The row's prompt as the chat template renders it: what a failed row carries (masked) in the batch."""
        messages = prompt_messages(row)
        try:
            return list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        except Exception:  # noqa: BLE001 - Responses-API items the template cannot render; packing uses a pad
            return None


def _row_labels(prompts: DataProto, n: int) -> list[str]:
    """How a refused batch's error names its first `n` rows: verl's batch row and the dataset's index."""
    indices = prompts.non_tensor_batch.get("index")
    return [f"batch row {i}" + (f" (dataset index {indices[i]})" if indices is not None else "") for i in range(n)]


def _data_sources(prompts: DataProto, rows) -> list[str]:
    """The input's own `data_source` when verl's batch has it (the trainer unions both sides), else the agent."""
    sources = prompts.non_tensor_batch.get("data_source")
    if sources is not None:
        return [str(s) for s in sources]
    return [row["agent_ref"]["name"] for row in rows]


def _adv_estimator(config: Any) -> str:
    """verl's `algorithm.adv_estimator` as a plain name ("" when the config has none)."""
    algorithm = config.get("algorithm") if hasattr(config, "get") else None
    name = algorithm.get("adv_estimator") if algorithm is not None else None
    return str(getattr(name, "value", name or ""))


def _gdpo_reward_keys(config: Any, adv_estimator: str) -> tuple[str, ...]:
    """Under verl's GDPO (`algorithm.adv_estimator=gdpo`), the reward components it normalizes one by one
    (`algorithm.gdpo_reward_keys`): each batch carries them per row, from the environments' `reward_components`."""
    if adv_estimator != "gdpo":
        return ()
    keys = config.algorithm.get("gdpo_reward_keys") or ()
    if not keys:
        raise ConfigError(
            "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the names of the reward components "
            "your NeMo Gym environments return in `reward_components` (e.g. [correctness,schema_valid,format])"
        )
    return tuple(str(key) for key in keys)


def _node_ip() -> str:
    """This node's address as Ray knows it (verl's servers are addressed the same way)."""
    import ray

    return ray.util.get_node_ip_address()


def _tokenizer(config: Any):
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local

    model = config.actor_rollout_ref.model
    return hf_tokenizer(copy_to_local(model.get("tokenizer_path") or model.path))
