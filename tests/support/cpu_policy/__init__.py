# SPDX-License-Identifier: Apache-2.0
"""Test support around the tiny policy: scripted policies, the test harness, and the hand-written policy server.

- `script`, `episodes`: scripted policies (played inside vLLM's real engine by `tests/support/engine/
  scripted_logits.py`); `harness`: the manager over verl's own vLLM rollout on CPU, as the integration tests drive it.
- `server`, `engine`, `model_policy`: the hand-written CPU policy server (vLLM 0.24's own OpenAI app, engine
  replaced), kept only for two faults vLLM's real engine cannot be made to produce (a non-finite log-prob, an EOS
  inside one generation: `test_reliability.py`'s fault-injection stack). Why not a fault-injecting proxy in front of
  the real engine: vLLM's OpenAI app answers HTTP 500 when its engine yields a NaN log-prob, a path only an engine
  that computes one takes (a proxy behind that app could only forge the 500), and with the server kept for that fault
  the EOS fault stays on it too.
"""
