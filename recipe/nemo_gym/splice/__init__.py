# SPDX-License-Identifier: Apache-2.0
"""Token-exact multi-turn prompts: splice the model's own token IDs into a re-rendered chat history.

Each turn an agent sends the whole chat history as messages, and the server re-renders it with the chat
template and re-tokenizes it. That does not reproduce the tokens the model generated (BPE merges differ,
templates drop `<think>` blocks from earlier turns, tool calls are re-serialised). NeMo Gym's training model
server sends back, on the assistant message of each model call, that call's `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`. This package turns those into the prompt to feed the engine,
or refuses the request with a `SpliceError` naming the rule that failed. One module per step:

- `carriers`: the messages that carry token IDs, checked, and the true prefix they give (`find_true_prefix`).
- `eos_splice`: rules 1 to 3, the EOS-counting splice itself, and `check_and_splice` (rules 1 to 4), which is
  what the server calls.
- `history_guard`: rule 4, the history's template text is what the model saw (`check_unedited_history`).
- `template_probe`: what a chat template writes, read from renders of a fixed probe conversation (the turn
  terminator the splice counts, the generation prompt rule 4 allows for).

Everything here is pure: no vLLM, Ray or HTTP import. `recipe.nemo_gym.server_patch` is the glue in vLLM.
"""
