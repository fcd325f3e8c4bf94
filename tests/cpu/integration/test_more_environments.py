# SPDX-License-Identifier: Apache-2.0
"""Eleven more of NeMo Gym's environments end to end, from the shipped `recipe/nemo_gym/configs/tools_and_games.yaml`
and `offline_blend.yaml`, in one Gym stack: each scores what the scripted policy answers itself, and every episode
packs with only the policy's tokens trained.

Path under test (nothing replaced; vLLM is its CPU build): the environments' own example rows from Gym's environment
(`.venv-gym`: Gym 0.7) -> the plugin's dataset -> the real manager over verl's vLLM rollout (the suite's shared
engine, splice patch armed; each row names its script) playing a scripted policy one token per character -> Gym's
servers -> the packed DataProto and the step's metrics:
- `tools_and_games.yaml`: `example_single_tool_call` (a real `get_weather` tool call between two model calls) and
  `blackjack` (Gym's `gymnasium_agent`: hit, then stand; the game deals its own cards);
- `offline_blend.yaml`: calendar (a pre-written history), example_tool_call_multireward (three reward components),
  freeform_formatting, xlam_fc, math_with_code (a stateful Python tool), structeval_nonrenderable, wordle (Gym's
  gymnasium_agent), reasoning_gym and code_gen (unit tests run in Ray tasks on Gym's own Ray), each playing one
  example row twice over: a right and a wrong answer
  (`tests/support/cpu_policy/offline_blend.py` says what each is and why the environment scores it so).
The two shipped configs' servers run in one stack (their `config_paths` together), so Gym starts once.
"""

from __future__ import annotations

import json

import pytest
import yaml

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness, offline_blend
from tests.support.cpu_policy.episodes import tools_and_games_policy
from tests.support.episode_checks import assert_trained_on_policy_tokens, model_calls

pytestmark = pytest.mark.integration

CONFIGS = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs"
TOOLS_AND_GAMES, OFFLINE_BLEND = CONFIGS / "tools_and_games.yaml", CONFIGS / "offline_blend.yaml"
WEATHER = "example_single_tool_call_simple_agent"
BLACKJACK = "blackjack_gymnasium_agent"
EXAMPLES = {
    WEATHER: "resources_servers/example_single_tool_call/data/example.jsonl",
    BLACKJACK: "resources_servers/blackjack/data/example.jsonl",
}
N = 2


def gym_root():
    from recipe.nemo_gym.config import NeMoGymSection
    from recipe.nemo_gym.gym.owned.gym_layout import section_root

    return section_root(NeMoGymSection(config_paths=["-"]))  # Gym's own files, in its environment


def tools_and_games_rows() -> list[dict]:
    rows = []
    for agent, path in EXAMPLES.items():
        for line in (gym_root() / path).read_text().splitlines():
            rows.append({**json.loads(line), "agent_ref": {"type": "responses_api_agents", "name": agent}})
    return rows


def both_configs(path):
    """The offline blend's environments file with tools_and_games' servers added: one stack for both."""
    config = yaml.safe_load(OFFLINE_BLEND.read_text())
    paths = config["nemo_gym"]["config_paths"]
    paths += [p for p in yaml.safe_load(TOOLS_AND_GAMES.read_text())["nemo_gym"]["config_paths"] if p not in paths]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, shared_engine):
    tmp = tmp_path_factory.mktemp("more_envs")
    games = tools_and_games_rows()
    plays = offline_blend.answers(gym_root())
    data = write_jsonl([*games, *(play.row for play in plays)], tmp / "rows.jsonl")
    rows = len(games) + len(plays)
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), both_configs(tmp / "plugin.yaml"), prompt_length=4096, response_length=1024, n=N,
        batch_size=rows,
    )  # fmt: skip
    scripts = [tools_and_games_policy()] * len(games) + [play.policy for play in plays]
    with harness.manager_stack(tiny_qwen3_dir(), overrides, data, scripts, engine=shared_engine) as stack:
        _, batch = harness.trainer_batches(stack["dataset"], range(rows), stack["config"])
        output = stack["manager"].generate_sequences(batch)
        results = list(stack["manager"].last_results)
        yield games, plays, output, results, stack["manager"]


def _rows_of(agent, rows, results):
    """The results of `agent`'s rows (each row ran N times, one after another)."""
    return [r for r, row in zip(results, (row for row in rows for _ in range(N)), strict=True)
            if row["agent_ref"]["name"] == agent]  # fmt: skip


def _offline(episodes):
    """(play, result, batch row) of the offline blend's episodes."""
    games, plays, _, results, _ = episodes
    start = N * len(games)
    return [(plays[i // N], results[start + i], start + i) for i in range(N * len(plays))]


def test_every_episode_of_every_environment_trains_on_exactly_the_policys_tokens(episodes):
    games, plays, output, results, _ = episodes
    print(f"\nNeMo Gym {episodes[4]._gym.version}: {len(results)} episodes")  # noqa: SLF001
    assert len(results) == len(output) == N * (len(games) + len(plays)) == 56
    failures = [r for r in results if isinstance(r, EpisodeFailure)]
    assert not failures and output.meta_info["timing"]["nemo_gym/all/failed"] == 0, failures
    assert_trained_on_policy_tokens(output, results)


def test_the_weather_tool_is_called_between_two_model_calls_and_verified(episodes):
    games, _, output, results, _ = episodes
    weather = _rows_of(WEATHER, games, results[: N * len(games)])
    assert len(weather) == 10
    for result in weather:
        assert len(model_calls(result)) == 2
        outputs = [item for item in result["response"]["output"] if item.get("type") == "function_call_output"]
        assert len(outputs) == 1  # the environment's own tool result, between the two calls
        assert result["reward"] == 1.0
    timing = output.meta_info["timing"]
    assert timing[f"nemo_gym/{WEATHER}/episodes"] == 10 and timing[f"nemo_gym/{WEATHER}/failed"] == 0


def test_blackjack_plays_hit_then_stand_and_the_game_decides_the_reward(episodes):
    games, _, output, results, _ = episodes
    hands = _rows_of(BLACKJACK, games, results[: N * len(games)])
    assert len(hands) == 10
    turns = [len(model_calls(hand)) for hand in hands]
    print(f"\nblackjack: model calls per game {turns}, rewards {[h['reward'] for h in hands]}")
    for hand, calls in zip(hands, turns, strict=True):
        assert hand["reward"] in (-1.0, 0.0, 1.0)
        assert calls in (1, 2)  # a hit that busts ends the hand at once (reward -1); else the stand ends it
        if calls == 1:
            assert hand["reward"] == -1.0
    # Multi-turn: a hand that did not bust on its hit (about 7 in 10) went on to a second model call.
    assert max(turns) == 2
    timing = output.meta_info["timing"]
    assert timing[f"nemo_gym/{BLACKJACK}/episodes"] == 10 and timing[f"nemo_gym/{BLACKJACK}/failed"] == 0


def test_each_offline_environment_scores_the_right_answer_and_the_wrong_one_itself(episodes):
    verdicts = [(p.agent, p.verdict, r["reward"], len(model_calls(r))) for p, r, _ in _offline(episodes)]
    print("\n" + "\n".join(f"{a} {v}: reward {r}, model calls {c}" for a, v, r, c in verdicts))
    expected = [(p.agent, p.verdict, p.reward, p.model_calls) for p, _, _ in _offline(episodes)]
    assert [(a, v, pytest.approx(r), c) for a, v, r, c in verdicts] == expected
    timing = episodes[2].meta_info["timing"]
    for agent in offline_blend.EXAMPLES:
        assert timing[f"nemo_gym/{agent}/episodes"] == 2 * N and timing[f"nemo_gym/{agent}/failed"] == 0


def test_calendars_pre_written_assistant_turns_are_prompt_and_never_trained(episodes):
    _, _, output, _, manager = episodes
    calendar = [(p, r, row) for p, r, row in _offline(episodes) if p.agent == offline_blend.CALENDAR]
    history = [m["content"] for m in calendar[0][0].row["responses_create_params"]["input"] if m["role"] == "assistant"]
    assert len(calendar) == 2 * N and len(history) == 4  # turns the policy never generated: they carry no token IDs
    for play, result, row in calendar:
        ((prompt_ids, generation_ids, _),) = model_calls(result)
        assert all(turn in manager.tokenizer.decode(prompt_ids) for turn in history)  # the one call's prompt holds them
        # What is trained is the policy's own answer and nothing else (its end-of-turn token after it).
        trained = output.batch["responses"][row][output.batch["response_mask"][row].bool()].tolist()
        assert trained == generation_ids and output.batch["prompts"][row][-len(prompt_ids) :].tolist() == prompt_ids
        answer = play.policy.rules[0].completion.text
        assert manager.tokenizer.decode(trained) in (answer, answer + manager.tokenizer.eos_token)


def test_each_reward_component_reaches_the_metrics_of_its_environment(episodes):
    for play, result, _ in _offline(episodes):
        if play.components:
            assert result["reward_components"] == play.components
    timing = episodes[2].meta_info["timing"]
    prefix = f"nemo_gym/{offline_blend.MULTIREWARD}/reward_component"
    assert {key: timing[key] for key in timing if key.startswith(prefix)} == {
        f"{prefix}/correctness/mean": 0.5,
        f"{prefix}/correctness/max": 1.0,
        f"{prefix}/format/mean": 0.0,
        f"{prefix}/format/max": 0.0,
        f"{prefix}/schema_valid/mean": 0.5,
        f"{prefix}/schema_valid/max": 1.0,
    }
    # No other environment returns components; `all` holds the same ones over every episode that returned them.
    others = sorted(key for key in timing if "/reward_component/" in key and not key.startswith(prefix))
    assert others == sorted(key.replace(offline_blend.MULTIREWARD, "all") for key in timing if key.startswith(prefix))
