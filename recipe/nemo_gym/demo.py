"""The main job on CPU: NeMo Gym's math and workplace environments, one real batch through the manager.

    python -m recipe.nemo_gym.demo [--policy model|scripted] [--out DIR]

What runs is the production path with one stand-in: the policy is a CPU server built on vLLM 0.24's own
OpenAI server with only the GPU engine replaced, serving a *tiny random-weight* Qwen3 model (the real Qwen3
tokenizer and chat template). Its text is gibberish, so rewards are 0 and episodes rarely call a tool; pass
`--policy scripted` for a policy that replays fixed tool-using turns (recipe/nemo_gym/cpu_policy/episodes.py).
Everything else is real: verl's trainer config, collate function and LLM client, NeMo Gym's servers from the
installed wheel with the splice patch active, the manager's packing and metrics.

It prints a per-environment table and writes the NeMo Gym results (`rollouts.jsonl`) and the packed batch
(`batch.pt`, verl's `DataProto.save_to_disk`) to the output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from recipe.nemo_gym.cpu_policy.harness import REPO_ROOT

MULTIENV = REPO_ROOT / "recipe" / "nemo_gym" / "configs" / "multienv.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("model", "scripted"), default="model")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "demo")
    parser.add_argument("--n", type=int, default=2, help="rollouts per prompt (rollout.n)")
    args = parser.parse_args(argv)

    from omegaconf import OmegaConf

    from recipe.nemo_gym.cpu_policy import harness
    from recipe.nemo_gym.cpu_policy.episodes import example_episodes_policy
    from recipe.nemo_gym.cpu_policy.server import CPUPolicyServer
    from recipe.nemo_gym.cpu_policy.tiny_model import tiny_qwen3_dir
    from recipe.nemo_gym.dataset import NeMoGymJSONLDataset
    from recipe.nemo_gym.metrics import summary_table

    args.out.mkdir(parents=True, exist_ok=True)
    print("NOTE: the policy is a tiny random-weight Qwen3 model on CPU (real Qwen3 tokenizer, template).", flush=True)
    print(f"      policy mode: {args.policy}. Rewards measure the plumbing, not a model.", flush=True)
    model_dir = tiny_qwen3_dir()
    data = harness.write_jsonl(harness.example_rows(), args.out / "rows.jsonl")
    overrides = harness.cpu_trainer_overrides(
        model_dir, MULTIENV, prompt_length=8192, response_length=256, n=args.n, batch_size=10
    )
    config = harness.compose_verl_config(overrides)
    dataset = NeMoGymJSONLDataset(data_files=[str(data)], tokenizer=None, processor=None, config=config.data)

    script = example_episodes_policy() if args.policy == "scripted" else None
    started = time.perf_counter()
    os.environ.setdefault("NEMO_GYM_VERL_CACHE", str(REPO_ROOT / ".cache"))
    with CPUPolicyServer(model_dir, script=script) as server, harness.manager_on_cpu_server(config, server) as manager:
        _, batch = harness.trainer_batches(dataset, range(len(dataset)), config)
        output = manager.generate_sequences(batch)
    elapsed = time.perf_counter() - started

    output.save_to_disk(str(args.out / "batch.pt"))
    with open(args.out / "rollouts.jsonl", "w") as f:
        for result in manager.last_results:
            f.write(json.dumps(result, default=str) + "\n")
    print()
    print(summary_table(manager.last_stats))
    print()
    timing = {k: round(float(v), 3) for k, v in output.meta_info["timing"].items() if "/all/" not in k}
    print(f"batch of {len(output)} episodes in {elapsed:.1f} s (including server start-up)")
    print(f"timing: rollout wait {timing['nemo_gym/rollout_wait']} s, packing {timing['nemo_gym/packing']} s")
    print(f"rollouts (NeMo Gym results): {args.out / 'rollouts.jsonl'}")
    print(f"packed batch (verl DataProto): {args.out / 'batch.pt'}")
    print(f"verl config used: {OmegaConf.select(config, 'actor_rollout_ref.rollout.agent')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
