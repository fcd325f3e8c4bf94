# SPDX-License-Identifier: Apache-2.0
"""Reliability of a rollout: dead policy server, splice refusals, the failure budget, over-long prompts.

Two layers (the pure functions, `server_error_cause`, `context_overflow_failure` and `PolicyWatch`, on exact inputs
and error bodies captured from the running stack, are tested in `tests/cpu/unit/gym/test_reliability_units.py`):
- the batch core (`probe_policy_server`, `run_examples_in_order`) on real sockets and HTTP servers;
- the real manager, created as verl creates it (verl's `LLMServerClient`), on NeMo Gym's real math and
  workplace servers and the hand-written CPU policy server (vLLM 0.24's OpenAI app with the splice patch, engine
  replaced by a script): vLLM's real engine cannot be made to send a non-finite log-prob or to go on generating
  after an EOS.

What the manager does on verl's own vLLM rollout is tested where one runs anyway: an unknown agent and verl's
`_validate` in `test_end_to_end.py` (the shared engine); verl's vLLM server actor killed while a batch waits on it
in `test_multiturn_http.py` (its own engine), and during training in `e2e/test_main_ppo.py`.

Every figure a test measures (seconds until an error, counts) is printed: run with `-s` to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from recipe.nemo_gym.failures import EpisodeFailure, FailureBudget, FailureBudgetExceeded, FailureCause, RolloutAborted
from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order
from recipe.nemo_gym.gym.over_http.health import PolicyWatch, ProbeResult, probe_policy_server
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.qwen3 import IM_END as EOS
from tests.support.cpu_policy.script import ScriptCompletion, ScriptedPolicy, ScriptMatch, ScriptRule
from tests.support.helpers import MATH_AGENT as MATH
from tests.support.helpers import WORKPLACE_AGENT as WORKPLACE
from tests.support.helpers import SharedStack, free_port, math_row, workplace_row

pytestmark = pytest.mark.integration

PROMPT_LENGTH = 6144
RESPONSE_LENGTH = 1024

# --------------------------------------------------------------------------------------------- policy health


class HealthServer:
    """A real HTTP server whose `/health` answers `status` after `delay_s`."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        self.status, self.delay_s, self.requests = status, delay_s, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.requests += 1
                time.sleep(owner.delay_s)
                self.send_response(owner.status if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_probe_tells_refused_and_silent_servers_from_slow_or_failing_ones():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    silent = socket.socket()  # accepts connections (kernel backlog) but never answers: a hung server
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    slow = HealthServer(status=503, delay_s=0.4)  # answers, slowly, with an error: alive
    try:

        async def probe_all() -> list[ProbeResult]:
            return await asyncio.gather(
                probe_policy_server(f"http://127.0.0.1:{closed_port}/v1", 2.0),
                probe_policy_server(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", 0.3),
                probe_policy_server(slow.base_url, 2.0),
            )

        refused, hung, answered = asyncio.run(probe_all())
    finally:
        silent.close()
        slow.close()
    assert refused == ProbeResult(f"http://127.0.0.1:{closed_port}/v1", False, "cannot connect (Connection refused)")
    assert (hung.alive, hung.detail) == (False, "no answer within 0.3s")
    # (the hung server's detail shows its own 0.3 s bound applied; no wall-clock bound is asserted)
    assert answered == ProbeResult(slow.base_url, True, "HTTP 503")


def test_batch_waiting_on_a_policy_server_that_stops_answering_is_aborted_naming_it():
    """The batch core with the real watch and real probes: slow-but-alive never aborts; a dead server does."""
    server = HealthServer(status=200, delay_s=0.15)
    watch = PolicyWatch([server.base_url], timeout_s=1.0, max_failures=3)
    closed_at: list[float] = []

    def kill() -> None:  # once it was probed five times: what it answered counts, not how fast this machine is
        deadline = time.monotonic() + 60
        while server.requests < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.close()
        closed_at.append(time.monotonic())

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(3600)  # as NeMo Gym's model server retrying a dead policy server: forever
        return {}

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        with pytest.raises(RolloutAborted) as err:
            asyncio.run(
                run_examples_in_order(
                    [{}, {}], post_run, deadline_s=60, health_check=watch.check, health_check_interval_s=0.2
                )
            )
        aborted_at = time.monotonic()
    finally:
        killer.join()
    probes_while_alive = server.requests
    print(f"\npolicy server closed -> batch aborted in {aborted_at - closed_at[0]:.2f}s ({watch.probes} probes)")
    assert probes_while_alive >= 5  # probed all along while it answered slowly, never aborted
    message = str(err.value)
    assert message.startswith(f"policy server(s) ['{server.base_url}'] unreachable with 2 of 2 episodes pending")
    assert "3 times in a row" in message and "Connection refused" in message
    assert 0 < aborted_at - closed_at[0] < 30.0  # after the close, not at the batch deadline (60 s)


# ----------------------------------------------------------------------------------- the real manager


# Dataset rows, by what the stack does with them. Words are one token each ("word " -> " word").
ROWS = {
    "good_math": math_row("What is 2+2?"),
    "nan_logprob": math_row("What is 2+2? MARK_NAN"),  # NaN log-prob: vLLM cannot send it (HTTP 500)
    "huge_logprob": math_row("What is 2+2? MARK_HUGE"),  # 1e39: sent, but infinite in float32
    "eos_inside": workplace_row("MARK_EOS_INSIDE"),  # an EOS inside a generation: the next turn is refused
    "good_workplace": workplace_row("MARK_TOOL"),  # a tool call, its result, a closing message
    "over_prompt_length": math_row("What is 2+2? " + "word " * 6500),  # fits the context (8192), not P
    "over_context": math_row("What is 2+2? " + "word " * 9000),  # beyond the model's 8192 positions
    "good_math_2": math_row("What is 3+1?"),
}
INDEX = {name: i for i, name in enumerate(ROWS)}
MIXED = list(ROWS)
EXPECTED_CAUSES = {
    "nan_logprob": FailureCause.NON_FINITE_LOGPROB,
    "huge_logprob": FailureCause.NON_FINITE_LOGPROB,
    "eos_inside": FailureCause.CONTIGUITY_BROKEN,
    "over_prompt_length": FailureCause.PROMPT_TOO_LONG,
    "over_context": FailureCause.PROMPT_TOO_LONG,
}


def scripted_policy(model_dir: Path) -> ScriptedPolicy:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    answer = ids("The answer is \\boxed{4}.")
    tool_call = "<tool_call>\n" + json.dumps(
        {"name": "company_directory_find_email_address", "arguments": {"name": "carlos"}}
    )
    tool_call += "\n</tool_call>"
    return ScriptedPolicy(
        rules=[
            ScriptRule(
                name="nan log-prob",
                when=ScriptMatch(last_message_regex="MARK_NAN"),
                completion=ScriptCompletion(
                    token_ids=answer, logprobs=[-0.1] * (len(answer) - 1) + [float("nan"), -0.1]
                ),
            ),
            ScriptRule(
                name="log-prob beyond float32",
                when=ScriptMatch(last_message_regex="MARK_HUGE"),
                completion=ScriptCompletion(token_ids=answer, logprobs=[-0.1] * (len(answer) - 1) + [1e39, -0.1]),
            ),
            ScriptRule(
                name="EOS inside the generation",
                when=ScriptMatch(assistant_turns=0, last_message_regex="MARK_EOS_INSIDE"),
                completion=ScriptCompletion(token_ids=ids(tool_call) + [EOS] + ids("ok")),
            ),
            ScriptRule(
                name="tool result seen: close",
                when=ScriptMatch(last_message_regex="<tool_response>"),
                completion=ScriptCompletion(text="Done.", split="char"),
            ),
            ScriptRule(
                name="look someone up",
                when=ScriptMatch(assistant_turns=0, last_message_regex="MARK_TOOL"),
                completion=ScriptCompletion(text=tool_call, split="char"),
            ),
            ScriptRule(name="answer 4", completion=ScriptCompletion(text="The answer is \\boxed{4}.", split="char")),
        ]
    )


def _environments_file(folder: Path) -> Path:
    path = folder / "plugin.yaml"
    path.write_text(
        f"""
nemo_gym:
  config_paths:
    - responses_api_models/vllm_model/configs/vllm_model_for_training.yaml
    - resources_servers/math_with_judge/configs/math_with_judge.yaml
    - resources_servers/workplace_assistant/configs/workplace_assistant.yaml
  head_server: {{port: {free_port()}}}
  log_dir: {folder}/logs
timeouts: {{startup_s: 600, batch_s: 300, health_check_interval_s: 1}}
failures: {{max_fraction: 0.05}}
"""
    )
    return path


def _stack_inputs(folder: Path) -> tuple[Path, list[str], Path]:
    """The model, the trainer overrides and the rows file every stack of this module is built from."""
    model_dir = tiny_qwen3_dir()
    data = write_jsonl(list(ROWS.values()), folder / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        model_dir,
        _environments_file(folder),
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
        n=1,
        batch_size=len(MIXED),
    )
    return model_dir, overrides, data


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    """The module's stack on the CPU policy server, started once for the module."""

    @contextlib.contextmanager
    def start():
        model_dir, overrides, data = _stack_inputs(tmp_path_factory.mktemp("reliability"))
        with harness.fault_injection_stack(model_dir, overrides, data, scripted_policy(model_dir)) as stack:
            yield stack

    with SharedStack(start) as holder:
        yield holder


@pytest.fixture
def stack(stacks):
    """The shared stack: no test kills anything in it."""
    return stacks.shared()


def _batch(stack, names):
    _, batch = harness.trainer_batches(stack["dataset"], [INDEX[n] for n in names], stack["config"])
    return batch


@pytest.fixture
def below_budget(stacks, stack):
    """The mixed batch with a budget it stays under: 5 of 8 rows fail, 6 may (run once per started stack)."""
    cache = stacks.cache
    if "below_budget" not in cache:
        manager = stack["manager"]
        manager.budget = FailureBudget(0.75)
        try:
            output = manager.generate_sequences(_batch(stack, MIXED))
        finally:
            manager.budget = FailureBudget(manager.plugin_config.failures.max_fraction)
        cache["below_budget"] = output, list(manager.last_results), manager.last_stats
    return cache["below_budget"]


def test_failed_rows_are_masked_with_reward_zero_and_the_rest_train(below_budget):
    output, _, stats = below_budget
    assert len(output) == len(MIXED)
    assert list(stats.failure_cause) == [EXPECTED_CAUSES.get(name, "") for name in MIXED]
    mask, scores = output.batch["response_mask"], output.batch["rm_scores"]
    for row, name in enumerate(MIXED):
        if name in EXPECTED_CAUSES:
            assert mask[row].sum().item() == 0, name
            assert torch.count_nonzero(scores[row]).item() == 0, name
            assert torch.count_nonzero(output.batch["rollout_log_probs"][row]).item() == 0, name
            assert output.batch["attention_mask"][row, PROMPT_LENGTH:].sum().item() == 1, name  # one pad, see packing
        else:
            assert mask[row].sum().item() > 0, name
    assert [scores[INDEX[n]].sum().item() for n in ("good_math", "good_math_2")] == [1.0, 1.0]


def test_failures_are_counted_by_cause_in_the_timing_metrics(below_budget):
    output, _, _ = below_budget
    timing = output.meta_info["timing"]
    counts = {cause.value: timing[f"nemo_gym/all/failed/{cause.value}"] for cause in FailureCause}
    print(f"\nfailed by cause: {counts}")
    assert counts == {
        "server_error": 0,
        "contiguity_broken": 1,
        "missing_generation": 0,
        "non_finite_logprob": 2,
        "bad_reward": 0,
        "prompt_too_long": 2,
        "environment_failed": 0,
        "judge_failed": 0,
        "cancelled": 0,
        "masked_by_environment": 0,
    }
    assert timing["nemo_gym/all/failed"] == 5 and timing["nemo_gym/all/episodes"] == 8
    assert timing[f"nemo_gym/{WORKPLACE}/failed/contiguity_broken"] == 1
    assert timing[f"nemo_gym/{MATH}/failed/prompt_too_long"] == 2


def test_each_failure_says_what_the_stack_did(below_budget):
    _, results, _ = below_budget
    by_name = dict(zip(MIXED, results, strict=True))
    # Failures decided by the runtime come back as EpisodeFailure; packing's own are raised from the result.
    nan = by_name["nan_logprob"]
    assert isinstance(nan, EpisodeFailure) and nan.cause is FailureCause.NON_FINITE_LOGPROB
    assert "could not send a non-finite log-prob: Out of range float values are not JSON compliant: nan" in nan.detail
    refused = by_name["eos_inside"]
    assert isinstance(refused, EpisodeFailure) and refused.cause is FailureCause.CONTIGUITY_BROKEN
    assert "rule 2 (unedited history) failed" in refused.detail
    over_context = by_name["over_context"]
    assert isinstance(over_context, EpisodeFailure) and over_context.cause is FailureCause.PROMPT_TOO_LONG
    # Over rollout.prompt_length but within the context: generated normally, refused by packing.
    assert isinstance(by_name["over_prompt_length"], dict) and isinstance(by_name["huge_logprob"], dict)


def test_failures_over_the_budget_fail_the_step_with_a_per_cause_summary(stack, below_budget):
    manager = stack["manager"]
    manager.budget = FailureBudget(0.5)
    try:
        with pytest.raises(FailureBudgetExceeded) as err:
            manager.generate_sequences(_batch(stack, MIXED))
    finally:
        manager.budget = FailureBudget(manager.plugin_config.failures.max_fraction)
    lines = str(err.value).splitlines()
    print(f"\n{err.value}")
    assert lines[0] == (
        "5 of 8 episodes failed, over the budget of 4 (failures.max_fraction 50.0% of 8, rounded up). By cause: "
        "contiguity_broken (data) = 1, non_finite_logprob (data) = 2, prompt_too_long (data) = 2."
    )
    assert lines[1] == "First failures:" and len(lines) == 7
