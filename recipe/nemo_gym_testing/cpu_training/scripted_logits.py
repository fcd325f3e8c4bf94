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

Configured by the CPU job runner (`job.py`) through verl's public rollout config:
`+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors=[<this class>]` and the script's path in
`SCRIPT_ENV`, which every process of the job inherits. Checked against vLLM 0.24.0's `LogitsProcessor` interface
(`vllm/v1/sample/logits_processor/interface.py`).
"""

from __future__ import annotations

import os

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from recipe.nemo_gym_testing.cpu_policy.script import ScriptedPolicy, choose_rule, scripted_output
from recipe.nemo_gym_testing.cpu_training import SCRIPT_ENV, SCRIPTED_PROCESSOR


class ScriptedLogitsProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        path = os.environ.get(SCRIPT_ENV)
        if not path:
            raise RuntimeError(f"{SCRIPTED_PROCESSOR} is configured but {SCRIPT_ENV} names no script file")
        self._policy = ScriptedPolicy.from_file(path)
        self._tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self._added_vocab = self._tokenizer.get_added_vocab()
        # batch row -> (the scripted token IDs, the request's live list of generated IDs)
        self._rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks

    def scripted_ids(self, prompt_ids: list[int]) -> list[int] | None:
        """The token IDs the script generates after `prompt_ids`, or None when no rule matches."""
        rule = choose_rule(self._policy, self._tokenizer.decode(prompt_ids, skip_special_tokens=False))
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
        for index, _params, prompt_ids, output_ids in batch_update.added:
            planned = self.scripted_ids(list(prompt_ids or []))
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
