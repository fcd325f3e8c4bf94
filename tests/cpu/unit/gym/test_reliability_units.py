# SPDX-License-Identifier: Apache-2.0
"""Reliability of a rollout, the pure parts: how an error body relayed by NeMo Gym becomes a failure cause
(`gym/over_http/outcomes.py`: splice refusals, non-finite log-probs, other server errors, a prompt over the
context), on exact inputs and on bodies captured from the running stack, and the policy server's health watch
(`gym/over_http/health.py`: its URL, its settings, consecutive failures). The same on real servers and the real manager:
`tests/cpu/integration/test_reliability.py`.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from recipe.nemo_gym.config import load_config
from recipe.nemo_gym.errors import ConfigError
from recipe.nemo_gym.failures import EpisodeFailure, FailureCause
from recipe.nemo_gym.gym.errors import PolicyServerUnreachable
from recipe.nemo_gym.gym.over_http.health import PolicyWatch, ProbeResult, policy_health_url
from recipe.nemo_gym.gym.over_http.outcomes import context_overflow_failure, server_error_cause, server_error_failure
from recipe.nemo_gym.splice.carriers import SpliceError, find_true_prefix
from recipe.nemo_gym.splice.eos_splice import TurnCountMismatch, splice_prompt_ids
from tests.support.helpers import MATH_AGENT as MATH
from tests.support.helpers import WORKPLACE_AGENT as WORKPLACE
from tests.support.results import synthetic_result

EOS = 151645
SPLICE_PREFIX = "token-exact splice refused: "

# --------------------------------------------------------------------------------------- captured bodies

# The body of a workplace row's `/run` (HTTP 500) when the splice patch refused the second model call (the
# policy's first generation held an EOS in its middle), captured from this file's stack: vLLM's 400, wrapped
# by NeMo Gym's model server and agent (each hop `repr`s the inner body). Kept as captured: SpliceError's message
# prefix (SPLICE_PREFIX), which the runtime recognises a refusal by, came later: the relay test rebuilds this body
# from today's message without it, and the classification tests read the bodies today's messages make.
REAL_REFUSAL_BODY = '"Hit an exception in SimpleAgent___workplace_assistant_simple_agent calling an inner server: b\'\\"Hit an exception in SimpleAgent___workplace_assistant_simple_agent calling an inner server: b\\\\\'\\\\\\\\\\"Hit an exception in VLLMModel___policy_model calling an inner server: b\\\\\\\\\\\\\\\\\\\\\'{\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"error\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":{\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"message\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"rule 2 (unedited history) failed: the model\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\'s own tokens hold 4 EOS token(s) (3 before the generation\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\'s end, generation ended on EOS) but the history rendered up to that turn holds 3; the history was edited after the model produced it (truncated, summarised, or a turn split or merged)\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\",\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"type\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"BadRequestError\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\",\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"param\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":null,\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"code\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":400}}\\\\\\\\\\\\\\\\\\\\\'\\\\\\\\\\"\\\\\'\\"\'"'  # noqa: E501 - byte-exact capture
# The body of a math row's `/run` when the policy's completion carried a NaN log-prob: vLLM's server cannot
# encode the response and answers 400 with the JSON encoder's message; NeMo Gym relays it the same way.
REAL_NAN_BODY = '"Hit an exception in SimpleAgent___math_with_judge_simple_agent calling an inner server: b\'\\"Hit an exception in SimpleAgent___math_with_judge_simple_agent calling an inner server: b\\\\\'\\\\\\\\\\"Hit an exception in VLLMModel___policy_model calling an inner server: b\\\\\\\\\\\\\\\\\\\\\'{\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"error\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":{\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"message\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"Out of range float values are not JSON compliant: nan\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\",\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"type\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"BadRequestError\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\",\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"param\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":null,\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"code\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":400}}\\\\\\\\\\\\\\\\\\\\\'\\\\\\\\\\"\\\\\'\\"\'"'  # noqa: E501 - byte-exact capture


def nemo_gym_relay(inner: bytes, hops: list[str]) -> str:
    """What NeMo Gym 0.4.0's exception middleware makes of an inner server's error body at each hop."""
    body = inner
    for key in hops:
        body = json.dumps(f"Hit an exception in {key} calling an inner server: {body}").encode()
    return body.decode()


def vllm_400(message: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}},
        separators=(",", ":"),
    ).encode()


def hops(agent: str) -> list[str]:
    """The servers an error passes on its way out, innermost first (the agent's middleware wraps it twice)."""
    return ["VLLMModel___policy_model", f"SimpleAgent___{agent}", f"SimpleAgent___{agent}"]


def splice_refusals() -> dict[str, str]:
    """The message of each of the splice's rules, produced by `recipe.nemo_gym.splice` itself."""
    messages = {}
    cases = {
        "rule 1": lambda: splice_prompt_ids([1, 2], [1, 2], [1, 2, 3], eos_token_id=EOS),
        "rule 2": lambda: splice_prompt_ids([1, EOS, 2, EOS], [1, EOS], [1, EOS, 3], eos_token_id=EOS),
        "rule 3": lambda: splice_prompt_ids([1, EOS], [1, EOS, 2, EOS], [1, EOS], eos_token_id=EOS),
        "one message per generation": lambda: find_true_prefix(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]},
                {"role": "assistant", "content": "b"},
            ]
        ),
    }
    for name, call in cases.items():
        with pytest.raises(SpliceError) as err:
            call()
        messages[name] = str(err.value)
    return messages


# --------------------------------------------------------------------------- failure causes of error bodies


def captured_refusal() -> SpliceError:
    """The refusal of REAL_REFUSAL_BODY, raised again: 4 EOS in the model's tokens, 3 in the render. The capture
    predates rule 2's explained causes (`eos_splice.explain_turn_count`), so its cause text is given as it was."""
    with pytest.raises(TurnCountMismatch) as err:
        splice_prompt_ids([EOS, EOS, EOS, 1, EOS], [EOS, EOS, EOS], [EOS] * 4, eos_token_id=EOS)
    old_cause = "the history was edited after the model produced it (truncated, summarised, or a turn split or merged)"
    return TurnCountMismatch(err.value.m, err.value.ended_on_eos, err.value.n, old_cause)


def test_real_splice_refusal_relayed_by_nemo_gym_is_contiguity_broken_with_a_readable_detail():
    body = nemo_gym_relay(vllm_400(str(captured_refusal())), hops(WORKPLACE))
    assert server_error_cause(body) is FailureCause.CONTIGUITY_BROKEN
    failure = server_error_failure(3, WORKPLACE, 500, body.encode())
    assert failure.cause is FailureCause.CONTIGUITY_BROKEN and failure.row == 3
    assert failure.detail == (
        f"agent {WORKPLACE!r} /run returned HTTP 500: the policy server refused the chat history (token-exact "
        "splice): rule 2 (unedited history) failed: the model's own tokens hold 4 EOS token(s) (3 before the "
        "generation's end, generation ended on EOS) but the history rendered up to that turn holds 3; the history "
        "was edited after the model produced it (truncated, summarised, or a turn split or merged)"
    )


def test_every_splice_rule_refusal_is_contiguity_broken_after_nemo_gyms_relay():
    refusals = splice_refusals()
    assert len(refusals) == 4
    for name, message in refusals.items():
        body = nemo_gym_relay(vllm_400(message), hops(WORKPLACE))
        assert server_error_cause(body) is FailureCause.CONTIGUITY_BROKEN, name
        detail = server_error_failure(0, WORKPLACE, 500, body).detail
        assert "refused the chat history (token-exact splice): rule " in detail, name


def test_relay_written_here_reproduces_the_captured_bodies_byte_for_byte():
    """So the bodies built for the rules the stack was not driven into are what the stack would send."""
    message = str(captured_refusal())
    assert message.startswith(SPLICE_PREFIX)
    assert nemo_gym_relay(vllm_400(message.removeprefix(SPLICE_PREFIX)), hops(WORKPLACE)) == REAL_REFUSAL_BODY
    nan_message = "Out of range float values are not JSON compliant: nan"
    assert nemo_gym_relay(vllm_400(nan_message), hops(MATH)) == REAL_NAN_BODY


def test_real_nan_log_prob_body_is_non_finite_logprob():
    assert server_error_cause(REAL_NAN_BODY) is FailureCause.NON_FINITE_LOGPROB
    failure = server_error_failure(1, MATH, 500, REAL_NAN_BODY)
    assert failure == EpisodeFailure(
        FailureCause.NON_FINITE_LOGPROB,
        f"agent {MATH!r} /run returned HTTP 500: the policy server could not send a non-finite log-prob: "
        "Out of range float values are not JSON compliant: nan",
        row=1,
    )


@pytest.mark.parametrize(
    "body",
    [
        '{"object":"error","message":"policy exploded","code":500}',
        "Internal Server Error",
        "",
        nemo_gym_relay(b'{"detail":"the rule of thumb failed"}', hops(MATH)),  # "rule" without a splice rule's shape
    ],
)
def test_other_error_bodies_stay_server_errors_cut_to_500_characters(body):
    assert server_error_cause(body) is FailureCause.SERVER_ERROR
    failure = server_error_failure(2, MATH, 500, body + "x" * 600)
    assert failure.cause is FailureCause.SERVER_ERROR
    assert failure.detail == f"agent {MATH!r} /run returned HTTP 500: {(body + 'x' * 600)[:500]}..."


def test_result_refused_as_over_the_context_is_prompt_too_long_and_a_cut_episode_is_not():
    # The shape NeMo Gym's model server gives an over-context first call: an empty message, cut on length.
    overflow = synthetic_result([([1], [2], [-0.1])], reward=0.0, agent_name=MATH)
    overflow["response"]["output"] = [
        {
            "id": "msg_0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        }
    ]
    overflow["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    assert context_overflow_failure(6, overflow) == EpisodeFailure(
        FailureCause.PROMPT_TOO_LONG,
        "the policy server refused the first model call as longer than the model's context (NeMo Gym's model "
        "server answered it as an empty turn cut on length); shorten the prompt or raise the context length",
        row=6,
    )

    cut = synthetic_result([([1, 2], [3, 4], [-0.1, -0.2])], reward=0.0)
    cut["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    assert context_overflow_failure(0, cut) is None  # generated tokens: an ordinary episode cut on length
    assert context_overflow_failure(0, synthetic_result([([1], [2], [-0.1])])) is None
    no_tokens = json.loads(json.dumps(overflow))
    no_tokens["response"]["incomplete_details"] = None
    assert context_overflow_failure(0, no_tokens) is None  # left to packing: MISSING_GENERATION
    assert context_overflow_failure(0, {"response": None}) is None


# ---------------------------------------------------------------------------------------- policy health


def test_policy_health_url_is_the_servers_root_health():
    assert policy_health_url("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/health"
    assert policy_health_url("http://10.0.0.1:8000/v1/") == "http://10.0.0.1:8000/health"
    assert policy_health_url("https://host/prefix") == "https://host/prefix/health"


@pytest.mark.parametrize(
    ("timeouts", "needle"),
    [
        ({"policy_health_failures": 0}, "timeouts.policy_health_failures: Input should be greater than or equal to 1"),
        ({"policy_health_timeout_s": 0}, "timeouts.policy_health_timeout_s: Input should be greater than 0"),
    ],
)
def test_the_yaml_refuses_policy_health_settings_that_could_never_pass(tmp_path, timeouts, needle):
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump({"nemo_gym": {"config_paths": ["x.yaml"]}, "timeouts": timeouts}))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(path)


def test_policy_watch_aborts_only_after_consecutive_failures_and_names_the_server():
    a, b = "http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"
    watch = PolicyWatch([a, b], timeout_s=10.0, max_failures=3)

    def down(url: str) -> ProbeResult:
        return ProbeResult(url, False, "cannot connect (Connection refused)")

    def up(url: str) -> ProbeResult:
        return ProbeResult(url, True, "HTTP 200")

    watch.record([down(a), up(b)], now=100.0)
    watch.record([down(a), down(b)], now=101.0)
    watch.record([up(a), down(b)], now=102.0)  # a answers: its count starts again
    assert watch.failures == {a: 0, b: 2}
    watch.record([down(a), up(b)], now=103.0)
    watch.record([down(a), down(b)], now=104.5)
    assert watch.failures == {a: 2, b: 1}
    with pytest.raises(PolicyServerUnreachable) as err:
        watch.record([down(a), down(b)], now=106.0)
    assert err.value.servers == (a,)
    assert str(err.value) == (
        f"policy server {a} did not answer GET http://10.0.0.1:8000/health 3 times in a row over 3.0s "
        "(last: cannot connect (Connection refused))"
    )
    assert watch.probes == 6


def test_a_judge_url_that_stops_answering_aborts_the_batch_naming_the_judge_server():
    """The judge's servers outside Gym are watched as the policy's are (`GymConnection.judge_urls`): Gym's model server
    retries one that does not answer forever, so the batch is aborted, naming it, within the health checks."""
    import asyncio

    from recipe.nemo_gym.failures import RolloutAborted
    from recipe.nemo_gym.gym.over_http.collect import run_examples_in_order

    judge = "http://judge-node:8000/v1"

    async def dead(url: str, timeout_s: float) -> ProbeResult:
        return ProbeResult(url, False, "cannot connect (Connection refused)")

    watch = PolicyWatch([judge], timeout_s=1.0, max_failures=2, probe=dead, role="judge server")

    async def post_run(i: int, row: dict) -> dict:
        await asyncio.sleep(30)  # an episode waiting on its judge, as Gym's model server would keep it
        return {}

    with pytest.raises(RolloutAborted) as err:
        asyncio.run(run_examples_in_order([{}, {}], post_run, deadline_s=20, health_check=watch.check,
                                          health_check_interval_s=0.05))  # fmt: skip
    message = str(err.value)
    assert message.startswith(f"judge server(s) ['{judge}'] unreachable with 2 of 2 episodes pending")
    assert f"judge server {judge} did not answer GET http://judge-node:8000/health 2 times in a row" in message


def test_a_judge_url_that_is_a_policy_server_is_watched_once():
    from recipe.nemo_gym.config import Timeouts
    from recipe.nemo_gym.gym.over_http.connection import GymConnection
    from recipe.nemo_gym.gym.types import PolicyServers

    policy = PolicyServers(("http://10.0.0.1:8000/v1",), "m")
    connection = GymConnection(
        loop=None, servers=(), targets={}, policy=policy, timeouts=Timeouts(), check_gym=None, connector_limits={},
        judge_urls=("http://10.0.0.1:8000/v1", "http://judge:8000/v1"),
    )  # fmt: skip
    assert connection.judge_urls == ("http://judge:8000/v1",)
