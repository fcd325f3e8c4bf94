# SPDX-License-Identifier: Apache-2.0
"""The names of the token data NeMo Gym's training model server attaches to each model call (0.4.0 to 0.7.0).

With `return_token_id_information: true`, `vllm_model` puts these three fields on the assistant output item of
every model call, and sends them back on that message in the next call's history. Packing reads them from a
result (`packing.episode`); the splice reads them from a chat request (`splice.carriers`).
"""

PROMPT_IDS_KEY = "prompt_token_ids"
GENERATION_IDS_KEY = "generation_token_ids"
GENERATION_LOGPROBS_KEY = "generation_log_probs"
TOKEN_FIELDS = (PROMPT_IDS_KEY, GENERATION_IDS_KEY, GENERATION_LOGPROBS_KEY)
