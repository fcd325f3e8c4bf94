# SPDX-License-Identifier: Apache-2.0
"""The main job on CPU: `./run_demo.sh` trains with verl's real `main_ppo` and this plugin on a NeMo Gym blend.

    python -m recipe.nemo_gym_testing.demo [--steps N] [--out DIR]

Embedded default: the tiny random-weight Qwen3 model (real Qwen3 tokenizer and chat template) trained with GRPO
for a few steps on a blend of NeMo Gym's math environment and this repository's example environment
`uppercase_share` (graded reward: the share of capital letters in the answer, which a random model can improve on
within a few steps, unlike math where it scores 0), validated before training on the whole blend of
`demo_blend.yaml`: math, NeMo Gym's multi-turn workplace assistant and uppercase_share. A checkpoint is written at
the end. verl, Ray, FSDP, verl's vLLM rollout with vLLM's engine (its
CPU build), NeMo Gym's servers and the manager are the real ones.

The console shows one line per step (reward per environment, loss, failures, rollout and packing time) and the
manager's progress lines; verl's full output goes to `<out>/main_ppo.log`, NeMo Gym's server logs to
`<out>/nemo_gym_logs/`, the per-step reward plot to `<out>/reward.png` and verl's metrics to
`<out>/metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recipe.nemo_gym_testing.cpu_training.job import (
    REPO_ROOT,
    JobSpec,
    OutputFolderInUse,
    hold_output_folder,
    run_job,
    write_reward_plot,
)

BLEND = REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "demo_blend.yaml"
UPPERCASE_ROWS = REPO_ROOT / "resources_servers" / "uppercase_share" / "data" / "train.jsonl"


# The workplace rows as NeMo Gym ships them offer all 27 tools (~4,100 prompt tokens). On CPU every row of a
# batch is padded to the longest prompt the job allows, so the demo offers three of them (~580 tokens) and
# trains at a prompt length of 768 instead of 4,608: the same rows, a step about five times cheaper.
WORKPLACE_TOOLS = ("company_directory_find_email_address", "email_search_emails", "email_reply_email")


def demo_rows(uppercase_rows: int, *, workplace: bool) -> list[dict]:
    """NeMo Gym's shipped math example rows, its workplace example rows if `workplace` (with `agent_ref`), and the
    first `uppercase_rows` of our uppercase_share rows."""
    from recipe.nemo_gym_testing.cpu_policy import harness

    agents = ["math_with_judge_simple_agent"] + (["workplace_assistant_simple_agent"] if workplace else [])
    rows = [
        harness.with_tools(row, WORKPLACE_TOOLS) if row["agent_ref"]["name"].startswith("workplace") else row
        for row in harness.example_rows(agents)
    ]
    lines = [line for line in UPPERCASE_ROWS.read_text().splitlines() if line.strip()]
    rows += [json.loads(line) for line in lines[:uppercase_rows]]
    return rows


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
    from recipe.nemo_gym_testing.cpu_policy import harness
    from recipe.nemo_gym_testing.cpu_policy.tiny_model import tiny_qwen3_dir

    print("The policy is a tiny random-weight Qwen3 model trained on CPU (real tokenizer and chat template):")
    print("it scores 0 on math and workplace; uppercase_share's graded reward is the one that can rise.", flush=True)
    # Training: 32 uppercase_share rows and NeMo Gym's 5 math rows, so 7 of a step's 8 prompts are, on average, ones
    # this model can learn from (a math group scores 0 in every sample: no advantage). The workplace rows are
    # validated, not trained: they too score 0 here, and at ~590 prompt tokens each (the uppercase prompts have ~25)
    # they were about 70% of a step's actor compute. With micro-batches of one sequence verl's actor computes each
    # sequence at its own length, so the prompt length of 768 the validation rows need costs the training rows nothing.
    train = harness.write_jsonl(demo_rows(uppercase_rows=32, workplace=False), out / "train.jsonl")
    val = harness.write_jsonl(demo_rows(uppercase_rows=4, workplace=True), out / "val.jsonl")
    spec = JobSpec(
        out_dir=out,
        model_dir=Path(tiny_qwen3_dir()),
        agent_loop_config=BLEND,
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
    result = run_job(spec, console=lambda line: print(line, flush=True))  # a failure's cause ends its output
    plot = write_reward_plot(result.steps, out / "reward.png")
    if result.exit_status == 0:
        print(f"main_ppo finished in {result.elapsed_s:.0f} s")
        print(f"metrics: {spec.metrics_file}; reward plot: {plot}; checkpoints: {spec.checkpoint_dir}")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
