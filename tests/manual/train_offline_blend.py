# SPDX-License-Identifier: Apache-2.0
"""Two `main_ppo` steps on `recipe/nemo_gym/configs/offline_blend.yaml`, run by hand (about 8 minutes here; not in
the suite, which runs the blend's episodes through the manager in `tests/cpu/integration/test_more_environments.py`):

    PYTHONPATH=. .venv/bin/python tests/manual/train_offline_blend.py OUT_DIR

The job goes through the launcher (the demo's console) on the CPU backend with verl's vLLM rollout. Each row plays its
scripted answer (`tests/support/cpu_policy/offline_blend.py`): step 1 the right ones, step 2 the wrong ones, so each
environment's reward in `OUT_DIR/job/metrics.jsonl` is its right answer's, then 0. It prints, per step, each
environment's reward, the failed count and `training/rollout_probs_diff_max`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from recipe.nemo_gym.config import NeMoGymSection
from recipe.nemo_gym.gym.owned.gym_layout import section_root
from recipe.nemo_gym_demo.console import JobSpec, run_job
from recipe.nemo_gym_demo.data import write_jsonl
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir
from tests.support.cpu_policy import offline_blend
from tests.support.cpu_policy.script import ScriptedPolicy
from tests.support.engine import scripted_overrides
from tests.support.engine.script_choice import scripted_row

BLEND = Path(__file__).resolve().parents[2] / "recipe" / "nemo_gym" / "configs" / "offline_blend.yaml"


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    plays = offline_blend.answers(section_root(NeMoGymSection(config_paths=["-"])))
    rows = []
    for verdict in ("right", "wrong"):
        for i, play in enumerate(p for p in plays if p.verdict == verdict):
            rows.append(scripted_row(play.row, play.policy.to_file(out / f"script-{verdict}-{i}.json")))
    environments = len(rows) // 2  # a batch: one row of each environment, all right (step 1) or all wrong (step 2)
    train = write_jsonl(rows, out / "train.jsonl")
    val = write_jsonl(rows[:environments], out / "val.jsonl")
    fallback = ScriptedPolicy(rules=[], fallback="model").to_file(out / "fallback.json")
    spec = JobSpec(
        out_dir=out / "job",
        model_dir=Path(tiny_qwen3_dir()),
        environments_file=BLEND,
        train_files=[train],
        val_files=[val],
        steps=2,
        batch_size=environments,
        n=2,
        prompt_length=3072,
        response_length=1024,
        lr=1e-2,
        val_before_train=False,
        extra_overrides=(*scripted_overrides(fallback), "data.shuffle=false"),
    )
    result = run_job(spec, console=print)
    print("exit", result.exit_status)
    for line in spec.metrics_file.read_text().splitlines():
        metrics = json.loads(line).get("data", {})
        wanted = ("reward/mean", "probs_diff_max", "/all/failed", "global_step")
        print(json.dumps({k: v for k, v in metrics.items() if k.endswith(wanted)}, sort_keys=True))
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
