# SPDX-License-Identifier: Apache-2.0
"""Two more of NeMo Gym's environments end to end, from the shipped `recipe/nemo_gym/configs/tools_and_games.yaml`.

Path under test (nothing replaced; vLLM is its CPU build): the environments' own example rows from Gym's
environment (`.venv-gym`: Gym 0.7) -> the plugin's dataset -> the real manager over verl's vLLM rollout (standalone,
splice patch armed; the suite's shared engine, each row naming its script) playing a scripted policy one token
per character -> Gym's `example_single_tool_call` (a real
`get_weather` tool call between two model calls) and `blackjack` (Gym's `gymnasium_agent`: hit, then stand; the
game deals its own cards) -> the packed DataProto.
"""

from __future__ import annotations

import json

import pytest

from recipe.nemo_gym.failures import EpisodeFailure
from recipe.nemo_gym.token_fields import TOKEN_FIELDS
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import harness
from tests.support.cpu_policy.episodes import tools_and_games_policy

pytestmark = pytest.mark.integration

CONFIG = harness.REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "tools_and_games.yaml"
WEATHER = "example_single_tool_call_simple_agent"
BLACKJACK = "blackjack_gymnasium_agent"
EXAMPLES = {
    WEATHER: "resources_servers/example_single_tool_call/data/example.jsonl",
    BLACKJACK: "resources_servers/blackjack/data/example.jsonl",
}
N = 2


def example_rows() -> list[dict]:
    from recipe.nemo_gym.config import NeMoGymSection
    from recipe.nemo_gym.gym.owned.seams import section_root

    root = section_root(NeMoGymSection(config_paths=["-"]))  # Gym's own files, in its environment
    rows = []
    for agent, path in EXAMPLES.items():
        for line in (root / path).read_text().splitlines():
            rows.append({**json.loads(line), "agent_ref": {"type": "responses_api_agents", "name": agent}})
    return rows


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, shared_engine):
    tmp = tmp_path_factory.mktemp("more_envs")
    rows = example_rows()
    data = write_jsonl(rows, tmp / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        tiny_qwen3_dir(), CONFIG, prompt_length=2048, response_length=512, n=N, batch_size=len(rows)
    )
    policy = tools_and_games_policy()
    with harness.manager_stack(tiny_qwen3_dir(), overrides, data, policy, engine=shared_engine) as stack:
        _, batch = harness.trainer_batches(stack["dataset"], range(len(rows)), stack["config"])
        output = stack["manager"].generate_sequences(batch)
        yield rows, output, list(stack["manager"].last_results), stack["manager"]._gym.version  # noqa: SLF001


def _calls(result):
    return [
        tuple(item[f] for f in TOKEN_FIELDS)
        for item in result["response"]["output"]
        if all(item.get(f) is not None for f in TOKEN_FIELDS)
    ]


def test_every_episode_of_both_environments_trains_with_contiguous_turns(episodes):
    rows, output, results, version = episodes
    print(f"\nNeMo Gym {version}: {len(results)} episodes")
    assert len(results) == len(output) == N * len(rows) == 20
    assert not [r for r in results if isinstance(r, EpisodeFailure)]
    assert output.meta_info["timing"]["nemo_gym/all/failed"] == 0
    for result in results:
        calls = _calls(result)
        for (prev_prompt, prev_gen, _), (prompt, _, _) in zip(calls, calls[1:], strict=False):
            assert prompt[: len(prev_prompt) + len(prev_gen)] == prev_prompt + prev_gen
    generated = [sum(len(gen) for _, gen, _ in _calls(r)) for r in results]
    assert output.batch["response_mask"].sum(-1).tolist() == generated
    assert output.batch["rm_scores"].sum(-1).tolist() == pytest.approx([float(r["reward"]) for r in results])


def test_the_weather_tool_is_called_between_two_model_calls_and_verified(episodes):
    rows, output, results, _ = episodes
    weather = [r for r, row in zip(results, (row for row in rows for _ in range(N)), strict=True)
               if row["agent_ref"]["name"] == WEATHER]  # fmt: skip
    assert len(weather) == 10
    for result in weather:
        assert len(_calls(result)) == 2
        outputs = [item for item in result["response"]["output"] if item.get("type") == "function_call_output"]
        assert len(outputs) == 1  # the environment's own tool result, between the two calls
        assert result["reward"] == 1.0
    timing = output.meta_info["timing"]
    assert timing[f"nemo_gym/{WEATHER}/episodes"] == 10 and timing[f"nemo_gym/{WEATHER}/failed"] == 0


def test_blackjack_plays_hit_then_stand_and_the_game_decides_the_reward(episodes):
    rows, output, results, _ = episodes
    games = [r for r, row in zip(results, (row for row in rows for _ in range(N)), strict=True)
             if row["agent_ref"]["name"] == BLACKJACK]  # fmt: skip
    assert len(games) == 10
    turns = [len(_calls(game)) for game in games]
    print(f"\nblackjack: model calls per game {turns}, rewards {[g['reward'] for g in games]}")
    for game, calls in zip(games, turns, strict=True):
        assert game["reward"] in (-1.0, 0.0, 1.0)
        assert calls in (1, 2)  # a hit that busts ends the hand at once (reward -1); else the stand ends it
        if calls == 1:
            assert game["reward"] == -1.0
    # Multi-turn: a hand that did not bust on its hit (about 7 in 10) went on to a second model call.
    assert max(turns) == 2
    timing = output.meta_info["timing"]
    assert timing[f"nemo_gym/{BLACKJACK}/episodes"] == 10 and timing[f"nemo_gym/{BLACKJACK}/failed"] == 0
