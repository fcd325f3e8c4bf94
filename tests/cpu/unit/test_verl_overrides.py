# SPDX-License-Identifier: Apache-2.0
"""The verl overrides that plug the recipe into `main_ppo` come from one place, and every user of them agrees.

`recipe.nemo_gym.verl_overrides.plugin_overrides` is the source; the launcher (which the submit scripts run), the
demo's job (through the launcher), the test harness and the README's command must each carry all of them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from recipe.nemo_gym.verl_overrides import MANAGER_CLASS, plugin_overrides
from tests.support.helpers import REPO_ROOT as REPO
from tests.support.helpers import dry_run_overrides, write_job


def test_plugin_overrides_name_the_manager_its_yaml_and_the_dataset_by_module():
    overrides = plugin_overrides("/configs/math.yaml")
    assert f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_CLASS}" in overrides
    assert "actor_rollout_ref.rollout.agent.agent_loop_config_path=/configs/math.yaml" in overrides
    assert "data.custom_cls.path=pkg://recipe.nemo_gym.dataset" in overrides
    assert "trainer.use_v1=false" in overrides
    # every key at most once, and the manager class it names defined where it says (by text: no verl import)
    keys = [item.split("=", 1)[0].lstrip("+") for item in overrides]
    assert len(keys) == len(set(keys))
    module, _, name = MANAGER_CLASS.rpartition(".")
    source = Path(importlib.util.find_spec(module).origin).read_text()
    assert re.search(rf"^class {name}\b", source, re.M)


def test_submit_scripts_pass_every_plugin_override(tmp_path):
    for script, yaml_name in (("submit_math.sh", "math.yaml"), ("submit_multienv.sh", "multienv.yaml")):
        job = write_job(tmp_path, yaml_name.removesuffix(".yaml"))
        argv = dry_run_overrides(REPO / script, job)
        # the launcher quotes every path for Hydra ('...'), so a path with `,` or `=` stays one value
        expected = plugin_overrides(f"'{REPO / 'recipe' / 'nemo_gym' / 'configs' / yaml_name}'")
        assert [item for item in argv if item in expected] == expected, script


def test_harness_and_the_demos_job_start_from_the_plugin_overrides(tmp_path):
    from recipe.nemo_gym.launch.compose import Backend, compose, hydra_string
    from recipe.nemo_gym.launch.job import load_job
    from recipe.nemo_gym_demo.console import JobSpec, write_job
    from tests.support.cpu_policy import harness

    expected = plugin_overrides("/blend.yaml")
    sizes = dict(prompt_length=8, response_length=8, n=1, batch_size=1)
    sized = harness.sized_overrides("/model", "/blend.yaml", **sizes)
    assert sized[: len(expected)] == expected
    assert "actor_rollout_ref.rollout.n=1" in sized and "data.max_prompt_length=8" in sized
    assert harness.cpu_trainer_overrides("/model", "/blend.yaml", **sizes)[: len(sized)] == sized
    blend = tmp_path / "blend.yaml"
    blend.write_text("nemo_gym:\n  config_paths: [a.yaml]\n")
    spec = JobSpec(
        out_dir=tmp_path / "out",
        model_dir=Path("/model"),
        environments_file=blend,
        train_files=[tmp_path / "t.jsonl"],
        val_files=[tmp_path / "v.jsonl"],
        steps=1,
        **sizes,
    )
    job = load_job(write_job(spec), environ={})
    # the demo's job goes through the launcher's one composition, which starts from the plugin's overrides
    overrides = compose(job, Backend(), REPO).overrides
    assert overrides[: len(expected)] == plugin_overrides(hydra_string(job.environments))


def test_readme_command_shows_every_plugin_override():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"The verl command the launcher runs is, in essence:\n\n```bash\n(.*?)```", readme, re.S)
    assert block, "README: the command block after 'The verl command the launcher runs is, in essence:'"
    shown = block.group(1).replace("\\\n", " ").split()
    config = "$REPO/recipe/nemo_gym/configs/multienv.yaml"
    missing = [item for item in plugin_overrides(config) if item not in shown]
    assert not missing, f"README's command lacks {missing}"
