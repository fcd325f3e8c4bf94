# SPDX-License-Identifier: Apache-2.0
"""Scripted turns inside vLLM's real engine: a vLLM logits processor that forces a `ScriptedPolicy`'s tokens.

A random tiny model cannot call tools, so tests that need a policy which does (the workplace environment's tool
calls, the math answers) script its turns. The script decides *which* tokens are generated; everything else is
vLLM's: its scheduler, its sampler, its detokenizer and tool parser, and the log-probs it reports. With
`logprobs_mode=raw_logprobs` vLLM computes those from the model's logits before any logits processor runs, so a
forced token carries the model's own log-prob under the current weights, exactly what verl's actor recomputes:
the `rollout_probs_diff` checks stay honest.

How a request is scripted: when vLLM adds a request to its batch, its prompt IDs are decoded (special tokens
kept) and the policy's first matching rule (`script.choose_rule`) gives the completion's token IDs
(`script.scripted_output`: the text split per the rule, then its terminator). At every decoding step the row's
logits are set to -inf except for the scripted token at the row's position. A request no rule matches is left to
the model, whatever the script's `fallback` says: a logits processor cannot fail one request (a test that needs every
request scripted checks the outcomes instead).
A completion that ends with `"length"` is forced up to its last token, then the model continues until the
request's `max_tokens`. Explicit `logprobs` in a script are ignored: the engine reports the model's.

Configured through verl's public rollout config: `+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=
[<this class>]`. Which script a request plays: the file named by its `SamplingParams.extra_args[SCRIPT_XARG]` (a
request's `vllm_xargs`, `script_choice.py`: one engine plays many modules' scripts), else the engine-wide file in
`SCRIPT_ENV` (a `main_ppo` job's, set by `scripted_overrides` in the Ray runtime env every process of the job inherits),
else none. Scripts are read once per file version (path, modification time, size). Checked against vLLM 0.24.0's
`LogitsProcessor` interface (`vllm/v1/sample/logits_processor/interface.py`) and `ChatCompletionRequest.vllm_xargs`.
"""

from __future__ import annotations

import os

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from tests.support.cpu_policy.script import ScriptedPolicy, choose_rule, scripted_output
from tests.support.engine import SCRIPT_ENV
from tests.support.engine.script_choice import SCRIPT_XARG


class ScriptedLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        self._default_file = os.environ.get(SCRIPT_ENV) or None
        self._policies: dict[str, tuple[tuple[int, int], ScriptedPolicy]] = {}
        if self._default_file is not None:
            self._policy(self._default_file)  # a bad engine-wide script fails the engine's start
        self._tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self._added_vocab = self._tokenizer.get_added_vocab()
        # batch row -> (the scripted token IDs, the request's live list of generated IDs)
        self._rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks

    def _policy(self, path: str) -> ScriptedPolicy:
        stat = os.stat(path)
        version = (stat.st_mtime_ns, stat.st_size)
        cached = self._policies.get(path)
        if cached is None or cached[0] != version:
            cached = self._policies[path] = (version, ScriptedPolicy.from_file(path))
        return cached[1]

    def scripted_ids(self, prompt_ids: list[int], script_file: str | None = None) -> list[int] | None:
        """The token IDs that the script in `script_file` (default: the engine-wide one) generates after
        `prompt_ids`, or None when there is no script or no rule matches."""
        script_file = script_file or self._default_file
        if script_file is None:
            return None
        rule = choose_rule(self._policy(script_file), self._tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if rule is None:
            return None
        output = scripted_output(
            rule.completion,
            encode=lambda text: self._tokenizer.encode(text, add_special_tokens=False),
            added_vocab=self._added_vocab,
            eos_token_id=self._tokenizer.eos_token_id,
            max_tokens=2**31,  # the request's own max_tokens is vLLM's to apply
        )
        return output.token_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        # vLLM's order: removed, added, moved; an added or moved request may replace a row.
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            extra_args = getattr(params, "extra_args", None) or {}
            planned = self.scripted_ids(list(prompt_ids or []), extra_args.get(SCRIPT_XARG))
            if planned is None:
                self._rows.pop(index, None)
            else:
                self._rows[index] = (planned, output_ids)
        for source, target, direction in batch_update.moved:
            moving = self._rows.pop(source, None)
            if direction == MoveDirectionality.SWAP:
                if (other := self._rows.pop(target, None)) is not None:
                    self._rows[source] = other
            else:
                self._rows.pop(target, None)
            if moving is not None:
                self._rows[target] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (planned, generated) in self._rows.items():
            position = len(generated)
            if position < len(planned):
                token = planned[position]
                logits[index].fill_(float("-inf"))
                logits[index, token] = 0.0
        return logits
