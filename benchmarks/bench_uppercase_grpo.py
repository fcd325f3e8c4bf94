# SPDX-License-Identifier: Apache-2.0
"""Does the tiny random-weight Qwen3 learn `uppercase_share` in a few GRPO steps? A pure-torch check, no verl.

The loop mirrors what verl 0.9.1 does for `algorithm.adv_estimator=grpo` with one update per step
(`ppo_mini_batch_size = train_batch_size`, `ppo_epochs=1`, so the PPO ratio is 1 and clipping never acts):

- `--prompts` prompts (the first 12 rows of resources_servers/uppercase_share/data/train.jsonl, in turn), each
  rendered with the model's chat template and sampled `--n` times for `--length` tokens at temperature 1 from
  the full vocabulary (stopping at EOS);
- reward = the environment's own `uppercase_share` on the decoded text (special tokens skipped, as vLLM does);
- advantage = (reward - group mean) / (group std + 1e-6), the same for every token of a response;
- loss = -sum(advantage * log-prob of each sampled token) / number of response tokens (verl's token-mean);
- AdamW (betas 0.9/0.999, weight decay 0.01: verl's defaults), gradient norm clipped to 1.0, constant lr.

Prints the mean reward of every step's rollouts (step 0 = before any update). Results are in
resources_servers/uppercase_share/README.md. On 2 CPU cores a step takes 30-60 s.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_uppercase_grpo.py --lr 3e-1 [--seed 0] [--steps 6]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from recipe.nemo_gym_demo.tiny_model import tiny_qwen3_dir

ENV_DIR = Path(__file__).resolve().parents[1] / "resources_servers" / "uppercase_share"
EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>
PAD = 151643


def load_reward():
    """The environment's reward function, from its app.py (a script NeMo Gym runs, not an importable package)."""
    spec = importlib.util.spec_from_file_location("uppercase_share_app", ENV_DIR / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.uppercase_share


def prompt_pool(size: int) -> list[str]:
    rows = (ENV_DIR / "data" / "train.jsonl").read_text().splitlines()[:size]
    return [json.loads(row)["responses_create_params"]["input"][-1]["content"] for row in rows]


@torch.no_grad()
def sample(model, prompt: torch.Tensor, prompt_mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`length` tokens per row at temperature 1 from the full vocabulary; after EOS a row is padding (mask 0)."""
    batch = prompt.shape[0]
    mask = prompt_mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt, attention_mask=mask, position_ids=positions, use_cache=True)
    responses = torch.full((batch, length), PAD)
    response_mask = torch.zeros(batch, length)
    done = torch.zeros(batch, dtype=torch.bool)
    eos = torch.tensor(EOS)
    for t in range(length):
        token = torch.multinomial(torch.softmax(out.logits[:, -1].float(), -1), 1).squeeze(-1)
        token = torch.where(done, torch.full_like(token, PAD), token)
        responses[:, t] = token
        response_mask[:, t] = (~done).float()
        done = done | torch.isin(token, eos)
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return responses, response_mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (the model is always the same)")
    parser.add_argument("--steps", type=int, default=6, help="updates; rollouts are measured before each and after")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (verl: data.train_batch_size)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (verl: rollout.n)")
    parser.add_argument("--length", type=int, default=32, help="response tokens (verl: rollout.response_length)")
    parser.add_argument("--pool", type=int, default=12, help="rows of train.jsonl the prompts cycle through")
    args = parser.parse_args()

    reward_fn = load_reward()
    pool = prompt_pool(args.pool)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    model_dir = tiny_qwen3_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.01)
    batch = args.prompts * args.n
    means = []
    for step in range(args.steps + 1):
        t0 = time.monotonic()
        texts = [pool[(step * args.prompts + i) % len(pool)] for i in range(args.prompts)]
        ids = [
            tokenizer(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            )["input_ids"]
            for t in texts
        ]
        width = max(map(len, ids))
        prompt = torch.full((batch, width), PAD)
        prompt_mask = torch.zeros(batch, width, dtype=torch.long)
        for i, row in enumerate(ids):  # left-padded, each prompt repeated n times in a row (one group)
            prompt[i * args.n : (i + 1) * args.n, width - len(row) :] = torch.tensor(row)
            prompt_mask[i * args.n : (i + 1) * args.n, width - len(row) :] = 1
        model.eval()
        responses, response_mask = sample(model, prompt, prompt_mask, args.length)
        decoded = [
            tokenizer.decode(
                [int(v) for v, m in zip(responses[b], response_mask[b], strict=True) if m and int(v) not in EOS],
                skip_special_tokens=True,
            )
            for b in range(batch)
        ]
        rewards = torch.tensor([reward_fn(text) for text in decoded])
        groups = rewards.view(args.prompts, args.n)
        advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).view(batch)
        means.append(rewards.mean().item())
        line = f"step {step}: reward {means[-1]:.4f}, mean group std {groups.std(1).mean().item():.4f}"
        if step == args.steps:
            print(f"{line} (rollouts only); sample: {decoded[0][:60]!r}", flush=True)
            break

        model.train()
        optimizer.zero_grad()
        sequences = torch.cat([prompt, responses], 1)
        sequence_mask = torch.cat([prompt_mask, response_mask.long()], 1)
        tokens = response_mask.sum()
        for s in range(0, batch, 8):  # micro-batches of 8: the full-vocabulary log-softmax is large
            mask = sequence_mask[s : s + 8]
            hidden = model.model(
                input_ids=sequences[s : s + 8], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
            ).last_hidden_state[:, width - 1 : -1]
            logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
            logp = logp.gather(-1, responses[s : s + 8, :, None]).squeeze(-1)
            loss = -(advantages[s : s + 8, None] * logp * response_mask[s : s + 8]).sum() / tokens
            loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"{line}, grad norm {grad_norm:.3f}, {time.monotonic() - t0:.0f}s", flush=True)
    print(f"lr {args.lr:g} seed {args.seed}: " + " ".join(f"{m:.3f}" for m in means))


if __name__ == "__main__":
    main()
