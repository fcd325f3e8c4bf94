# SPDX-License-Identifier: Apache-2.0
"""NeMo Gym's catalogue end to end: every resources server the suite runs beyond the shipped blends, code-scored and
judge-scored, each scoring a right and a wrong answer to one of its own example rows itself.

Path under test (nothing replaced; vLLM is its CPU build): Gym's example rows (`.venv-gym`: Gym 0.7) -> the plugin's
dataset -> the real manager over verl's vLLM rollout (the suite's shared engine, splice patch armed; each row names
its script) -> Gym's servers, started from the shipped environments files of `recipe/nemo_gym/configs/` (one per kind),
several kinds to a stack (`STACKS`) -> the packed DataProto and the step's metrics (`tests/support/catalogue_stack.py`).
The answers, and why each server scores them so: `tests/support/cpu_policy/catalogue/` (one module per shipped config).

The judged stacks' judge is the plugin's own, `judge: policy` as their configs ship it: verl's servers (the shared
engine), playing a script of verdicts, one per answer. `judged_qa` runs through a judge URL in `test_judges.py`.
"""

from __future__ import annotations

import pytest

from tests.support.catalogue_stack import check_scores, check_tokens, play

pytestmark = pytest.mark.integration

# The kinds of each stack, in one NeMo Gym; stacks run one after another. A Gym server takes about 150 MB and 2 to 4
# CPU-seconds to start, and an environment three of them (resources server, agent, the environment server in front),
# so about ten environments go to a stack. More of them would add their fixed part (Gym's launcher and Ray, the head
# and policy model servers, the manager, verl's load balancer); a bigger one starts more slowly than two of ten (a stack
# of 15 took about six minutes to start on 2 cores, where stacks of 9 and 10 took 80 to 105 s) and raises the peak.
STACKS = {
    "knowledge": ("knowledge",),
    "grading_and_science": ("grading", "science"),
    "long_context_and_puzzles": ("long_context", "puzzles"),
    "games_and_tools": ("games", "stateful_tools", "tool_use"),
    "judged_instructions": ("judged_instructions",),
    "judged_science_and_safety": ("judged_science", "judged_safety"),
}


@pytest.fixture(scope="module")
def one_ray():
    """One local Ray for every stack of the module (each would otherwise start and stop its own)."""
    import ray

    from tests.support.engine.standalone import init_local_ray

    init_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module", params=list(STACKS))
def played(request, tmp_path_factory, shared_engine, one_ray):
    with play(tmp_path_factory.mktemp(request.param), shared_engine, STACKS[request.param]) as result:
        yield result


def test_each_resources_server_scores_the_right_answer_above_the_wrong_one_itself(played):
    check_scores(played)


def test_every_episode_of_every_resources_server_trains_on_exactly_the_policys_tokens(played):
    check_tokens(played)
