# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for multi-turn games played by Gym's `gymnasium_agent`, where the environment's `step`
answers every model call (its observation comes back as the next user message, its tool results before it) and the
agent sums the step rewards. The verdicts were read from each server's `reset`/`step` in Gym 0.7.0:

- example_multi_turn_gymnasium, row 0 (capital of France, then two scripted follow-ups): `step` sends the row's
  `follow_ups` one per turn (reward 0), then scores the third answer: 1.0 when it contains `expected_answer`
  ("Eiffel", case-insensitive), else 0.0. Right: Paris, its population, the Eiffel Tower; wrong: the Louvre as the
  landmark. Three model calls each.
- grl_sokoban, row 0 (seed 84810, a 5x5 room: box one square above the player, target up and to its left): the
  room is generated from the row's seed (`SokobanEnv.reset` seeds `random` and numpy, so every episode is the same
  room); each turn's first <action> is one move, -0.1 a step, +1 for the box on target and +10 for the solve,
  which ends the game. Right: Up, Right, Up, Left (10.6, four calls); wrong: first walks into the wall below
  (Down: an ineffective move, still -0.1), then the same four (10.5, five calls). Only a solve or the agent's 20
  turns end an episode, and 20 turns of observations would not fit the 1024-token response, so the wrong answer
  solves too, one step worse.
- openair_congestion, row 0 (prb_exhaustion, seed 7001; `replay` backend, deterministic from the seed): each turn
  must be exactly one tool call; `step` returns the KPI reward of the transition (`rewards.compute_breakdown`),
  and a turn without a tool call advances as `noop` plus `protocol_violation_penalty` (-1.0). Two turns (see
  TEST_OVERRIDES). Right: Gym's own scripted relief policy (`client.choose_action`): `set_ul_power_control` on cell 0
  (p0 10 dBm, alpha 1.0), then `noop`: -0.8141648826981969, exactly the shipped `data/example_rollouts.jsonl`
  row 0; wrong: two plain-text turns with no tool call: the noop trajectory less 2 (-2.8273848677723805).

grl_tetris is left out: its pieces are not seeded by the row. `TetrisEnv.__init__` calls an unseeded `reset()`
that draws 17 pieces with the process's `random` and counts them in `_shape_counts`, which the seeded reset never
clears and which weight every later draw (`tetris_env.py`, `_choose_shape`), so the same seed deals different
pieces per server process. Over every possible count vector, an exhaustive search of the 4x4 board finds, for
each shipped row, deals where no play clears exactly one line (row 1: four vertical I pieces first; row 0: O, I,
O) and deals where none clears exactly two; and only a clear or a top-out ends a game before the agent's 20 turns
(whose observations would not fit the response), so no scripted answer has one exact reward.

TEST_OVERRIDES (the test's, not the shipped config's): openair_congestion's episode runs `min(row max_steps,
agent_max_steps)` steps; its config says 16, and 16 turns of ~350-token KPI reports neither fit the test's
1024-token response nor the tiny model's context, so `agent_max_steps` is 2 here, as Gym's own
`generate_example_rollouts.py` uses (`EVIDENCE_MAX_STEPS = 2`).

Pure: builds rows and `ScriptedPolicy`s; no vLLM, HTTP or Gym import.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.cpu_policy.answers import Answer, example_row, policy, tool_call
from tests.support.cpu_policy.script import ScriptMatch

CONFIGS = [
    "resources_servers/example_multi_turn_gymnasium/configs/example_multi_turn_gymnasium.yaml",
    "resources_servers/grl_sokoban/configs/grl_sokoban.yaml",
    "resources_servers/openair_congestion/configs/openair_congestion.yaml",
]

MULTI_TURN = "example_multi_turn_gymnasium_agent"
SOKOBAN = "grl_sokoban_gymnasium_agent"
OPENAIR = "openair_congestion_gymnasium_agent"

EXAMPLES = {  # agent -> (Gym's example file, the row used)
    MULTI_TURN: ("resources_servers/example_multi_turn_gymnasium/data/example.jsonl", 0),
    SOKOBAN: ("resources_servers/grl_sokoban/data/example.jsonl", 0),
    OPENAIR: ("resources_servers/openair_congestion/data/example.jsonl", 0),
}

# Two openair turns instead of 16, to fit the test's response budget: see the module docstring.
TEST_OVERRIDES = {"openair_congestion": {"resources_servers": {"openair_congestion": {"agent_max_steps": 2}}}}

# Sokoban row 0's room, as its seed generates it:   #####
#                                                   #O__#
#                                                   #_X_#
#                                                   #_P_#
#                                                   #####
SOLVE = ("Up", "Right", "Up", "Left")  # push the box up, walk round to its right, push it left onto the target
WALL = "Down"  # the wall below the player: the player stays put

RELIEF = {"cell_id": 0, "p0_dbm": 10.0, "alpha": 1.0}  # client.choose_action's pick for row 0 (p99 PRB at 100%)
RELIEF_RETURN = -0.3997636685661762 + -0.41440121413202063  # the two step rewards of the shipped example rollout
NOOP_RETURN = -0.39976711556167965 + -0.4276177522107008  # the same two steps under noop
PROTOCOL_PENALTY = -1.0  # the server's protocol_violation_penalty, per turn without a tool call


def _turns(*texts: str):
    """A script saying `texts[k]` on the turn after k assistant messages."""
    return policy(*((ScriptMatch(assistant_turns=k), text) for k, text in enumerate(texts)))


def _moves(*moves: str) -> list[str]:
    return [f"<action>{move}</action>" for move in moves]


def answers(gym_root: Path) -> list[Answer]:
    """A right and a wrong answer per game, over the example rows under `gym_root` (Gym's installed files), each
    row naming its agent."""
    rows = {agent: example_row(gym_root, path, index, agent) for agent, (path, index) in EXAMPLES.items()}
    capital, population = "Paris is the capital of France.", "About 2.1 million people live in Paris."
    landmark = f"The {rows[MULTI_TURN]['expected_answer']} Tower."
    relief, noop = tool_call("set_ul_power_control", RELIEF), tool_call("noop", {})
    silent = "The cells look fine to me."
    return [
        Answer(MULTI_TURN, "right", rows[MULTI_TURN], _turns(capital, population, landmark), 1.0, 3),
        Answer(MULTI_TURN, "wrong", rows[MULTI_TURN], _turns(capital, population, "The Louvre."), 0.0, 3),
        Answer(SOKOBAN, "right", rows[SOKOBAN], _turns(*_moves(*SOLVE)), 10.6, 4),
        Answer(SOKOBAN, "wrong", rows[SOKOBAN], _turns(*_moves(WALL, *SOLVE)), 10.5, 5),
        Answer(OPENAIR, "right", rows[OPENAIR], _turns(relief, noop), RELIEF_RETURN, 2),
        Answer(OPENAIR, "wrong", rows[OPENAIR], _turns(silent, silent), NOOP_RETURN + 2 * PROTOCOL_PENALTY, 2),
    ]
