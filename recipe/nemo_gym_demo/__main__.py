# SPDX-License-Identifier: Apache-2.0
"""The main job on CPU: `./run_demo.sh` trains with verl's real `main_ppo` and this plugin on a NeMo Gym blend.

    python -m recipe.nemo_gym_demo [--steps N] [--out DIR]

Embedded default: the tiny random-weight Qwen3 model (real Qwen3 tokenizer and chat template) trained with GRPO
for a few steps on a blend of NeMo Gym's math environment and this repository's example environment
`uppercase_share` (graded reward: the share of capital letters in the answer, which a random model can improve on
within a few steps, unlike math where it scores 0), validated before training on the whole blend of
`demo_blend.yaml`: math, NeMo Gym's multi-turn workplace assistant and uppercase_share. A checkpoint is written at
the end. verl, Ray, FSDP, verl's vLLM rollout with vLLM's engine (its CPU build), NeMo Gym's servers and the
manager are the real ones.

The demo writes its job as a job file (`<out>/job.yaml`, `backend: cpu`) and runs it through the launcher, as a
Slurm job runs (`console.py`). The console shows the launcher's lines, one line per step (reward per environment,
loss, failures, rollout and packing time) and the manager's progress lines; verl's full output goes to
`<out>/main_ppo.log`, NeMo Gym's server logs to `<out>/nemo_gym_logs/`, the per-step reward plot to
`<out>/reward.png` and verl's metrics to `<out>/metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.nemo_gym_demo.console import (
    REPO_ROOT,
    JobSpec,
    OutputFolderInUse,
    hold_output_folder,
    run_job,
)
from recipe.nemo_gym_demo.data import BLEND, demo_rows, write_jsonl
from recipe.nemo_gym_demo.plot import write_reward_plot
from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "demo")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    try:
        with hold_output_folder(out):  # before anything is written there
            return _run(out, args.steps)
    except OutputFolderInUse as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the trainer started (while the trainer runs, run_job handles it)
        print("demo: interrupted (SIGINT) before training started", file=sys.stderr)
        return 130


def _run(out: Path, steps: int) -> int:
    print("The policy is a tiny random-weight Qwen3 model trained on CPU (real tokenizer and chat template):")
    print("it scores 0 on math and workplace; uppercase_share's graded reward is the one that can rise.", flush=True)
    # Training: 32 uppercase_share rows and NeMo Gym's 5 math rows, so 7 of a step's 8 prompts are, on average, ones
    # this model can learn from (a math group scores 0 in every sample: no advantage). The workplace rows are
    # validated, not trained: they too score 0 here, and at ~590 prompt tokens each (the uppercase prompts have ~25)
    # they were about 70% of a step's actor compute. With micro-batches of one sequence verl's actor computes each
    # sequence at its own length, so the prompt length of 768 the validation rows need costs the training rows nothing.
    train = write_jsonl(demo_rows(uppercase_rows=32, workplace=False), out / "train.jsonl")
    val = write_jsonl(demo_rows(uppercase_rows=4, workplace=True), out / "val.jsonl")
    spec = JobSpec(
        out_dir=out,
        model_dir=Path(tiny_qwen3_dir()),
        environments_file=BLEND,
        train_files=[train],
        val_files=[val],
        steps=steps,
        batch_size=8,
        n=8,
        prompt_length=768,
        # 4-token answers at lr 3e-1: in benchmarks/bench_uppercase_grpo.py's loop every one of 8 sampling seeds rose
        # from ~0.09 to 0.33-1.00 within 4 updates (16 tokens: 2 of 2 rose there, 1 of 2 verl demo runs did; lr 1e-1:
        # 1 of 4 rose). A random-weight model moves only at a high rate; a shorter answer ties a sample's reward to
        # fewer tokens.
        response_length=4,
        lr=3e-1,
        save_freq=steps,
        test_freq=-1,
        val_before_train=True,
    )
    result = run_job(spec, console=lambda line: print(line, flush=True))  # the launcher's last lines end the output
    plot = write_reward_plot(result.steps, out / "reward.png")
    if result.exit_status == 0:
        print(f"main_ppo finished in {result.elapsed_s:.0f} s")
        print(f"metrics: {spec.metrics_file}; reward plot: {plot}; checkpoints: {spec.checkpoint_dir}")
        print(f"the job it ran: {spec.job_file} (python -m recipe.nemo_gym.launch run {spec.job_file} runs it again)")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
