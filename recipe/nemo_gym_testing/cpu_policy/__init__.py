# SPDX-License-Identifier: Apache-2.0
"""A CPU stand-in for verl's vLLM rollout server, used by the tests and the CPU demo job.

Only vLLM's GPU engine is replaced: the OpenAI-compatible HTTP app, the chat renderer, the tool parser and
`/tokenize` are vLLM 0.24's own code. The policy is a tiny random-weight Qwen3 model built locally
(`tiny_model`), or a script of completions a test decides in advance (`engine.ScriptedPolicy`).
"""
