# SPDX-License-Identifier: Apache-2.0
"""Count a tokenizer's chat template renders and tokenizations, for the splice tests and benchmark.

vLLM 0.24 renders every chat template through the tokenizer's `apply_chat_template` and tokenizes through its
`encode` (from its thread pool, on the same object), so counting those two calls counts renders and
tokenizations whatever vLLM layer makes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

COUNTED = ("apply_chat_template", "encode")


@contextlib.contextmanager
def counted_tokenizer_calls(tokenizer: Any) -> Iterator[dict[str, int]]:
    """Within the block, `counts[name]` is how many times `tokenizer.<name>` was called, for each name in COUNTED."""
    counts = dict.fromkeys(COUNTED, 0)

    def counting(name: str) -> Callable[..., Any]:
        method = getattr(tokenizer, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return method(*args, **kwargs)

        return call

    for name in COUNTED:
        setattr(tokenizer, name, counting(name))  # an instance attribute shadows the method; deleting it restores it
    try:
        yield counts
    finally:
        for name in COUNTED:
            delattr(tokenizer, name)
