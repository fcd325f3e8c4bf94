# SPDX-License-Identifier: Apache-2.0
"""Test support around the tiny policy: the tiny Qwen3 model, scripted policies, the test harness, and a stand-in.

- `tiny_model`: the tiny random-weight Qwen3 model built locally; `script`, `episodes`: scripted policies (played
  inside vLLM's real engine by `cpu_training/scripted_logits.py`); `harness`: the manager over verl's own vLLM
  rollout on CPU, as the integration tests drive it.
- `server`, `engine`, `model_policy`: the hand-written CPU policy server (vLLM 0.24's own OpenAI app, engine
  replaced). It remains only for faults vLLM's real engine cannot be made to produce (a non-finite log-prob, an EOS
  inside one generation: `test_reliability.py`'s fault-injection stack).
"""
