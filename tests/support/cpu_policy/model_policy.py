# SPDX-License-Identifier: Apache-2.0
"""Token-by-token generation with a causal LM on CPU (transformers + torch; no vLLM, no HTTP).

`CausalLMSampler.generate(prompt_ids, spec)` returns the generated tokens, each with the log-prob vLLM would
report by default (`logprobs_mode="raw_logprobs"`: the log-softmax of the model's raw logits, before
temperature or top-k/top-p), its rank in that distribution, and the `spec.num_top_logprobs` best alternatives.

Sampling follows vLLM's conventions: a temperature below 1e-5 is greedy; otherwise logits are divided by the
temperature, filtered by `top_k` (0 or -1: off) and `top_p`, and sampled with a `torch.Generator` seeded from
`spec.seed` (fresh entropy when None), so a seeded request is reproducible. Sampling stops after the EOS
ID (unless `ignore_eos`) or a stop token ID, both included in the output as vLLM includes them, or at
`max_tokens` (finish reason "length"). Before `min_tokens` tokens, stop IDs cannot be sampled.

The sampler is not thread-safe; the engine calls it from one worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    eos_token_id: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    num_top_logprobs: int = 0


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class SampledGeneration:
    tokens: list[SampledToken] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "length"
    stop_reason: int | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]


class CausalLMSampler:
    def __init__(self, model_dir: str | Path):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    def generate(self, prompt_ids: list[int], spec: SamplingSpec) -> SampledGeneration:
        torch = self._torch
        if not prompt_ids:
            raise ValueError("cannot generate from an empty prompt")
        generator = torch.Generator()
        if spec.seed is None:
            generator.seed()
        else:
            generator.manual_seed(spec.seed)
        stops = set(spec.stop_token_ids)
        if spec.eos_token_id is not None and not spec.ignore_eos:
            stops.add(spec.eos_token_id)

        result = SampledGeneration()
        past = None
        step_input = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.inference_mode():
            for _ in range(spec.max_tokens):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                token = self._pick(logits, spec, generator, stops if len(result.tokens) < spec.min_tokens else set())
                chosen = float(logprobs[token])
                rank = int((logprobs > logprobs[token]).sum()) + 1
                top: tuple[tuple[int, float], ...] = ()
                if spec.num_top_logprobs > 0:
                    values, indices = torch.topk(logprobs, spec.num_top_logprobs)
                    top = tuple((int(i), float(v)) for i, v in zip(indices, values, strict=True))
                result.tokens.append(SampledToken(token_id=token, logprob=chosen, rank=rank, top=top))
                if token in stops:
                    result.finish_reason = "stop"
                    result.stop_reason = None if token == spec.eos_token_id else token
                    break
                step_input = torch.tensor([[token]], dtype=torch.long)
        return result

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Raw log-probs of `completion_ids` following `prompt_ids` under the current weights (one forward pass).

        What the engine reports for scripted tokens when asked to, so a trainer recomputing log-probs sees the
        same numbers for tokens it did not sample.
        """
        torch = self._torch
        if not prompt_ids or not completion_ids:
            return []
        ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(-1, torch.tensor(completion_ids, dtype=torch.long)[:, None])[:, 0]
        return [float(v) for v in chosen]

    def load_weights(self, path: str | Path) -> int:
        """Replace the model's weights with the tensors of a safetensors file; returns how many were loaded.

        Every tensor must name a parameter or buffer of the model with the same shape; parameters the file lacks
        must be tied to one it has (e.g. `lm_head.weight` with tied embeddings).
        """
        from safetensors.torch import load_file

        state = load_file(str(path))
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"weights {path} name tensors the model does not have: {unknown[:5]}")
        for name, tensor in state.items():
            if tensor.shape != own[name].shape:
                raise ValueError(
                    f"weights {path}: {name} has shape {tuple(tensor.shape)}, model {tuple(own[name].shape)}"
                )
        tied = {name for name in own if name not in state and name.endswith("lm_head.weight")}
        missing = sorted(set(own) - set(state) - tied)
        if missing:
            raise ValueError(f"weights {path} lack tensors of the model: {missing[:5]}")
        with self._torch.no_grad():
            self.model.load_state_dict(state, strict=False)
        return len(state)

    def _pick(self, logits, spec: SamplingSpec, generator, banned: set[int]) -> int:
        torch = self._torch
        if banned:
            logits = logits.clone()
            logits[list(banned)] = float("-inf")
        if spec.temperature < GREEDY_TEMPERATURE:
            return int(torch.argmax(logits))
        scaled = logits / spec.temperature
        if spec.top_k and spec.top_k > 0:
            kth = torch.topk(scaled, min(spec.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if spec.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop a token once the mass before it already reaches top_p; the best token always survives.
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= spec.top_p
            scaled = scaled.clone()
            scaled[order[drop]] = float("-inf")
        probs = torch.softmax(scaled, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))
