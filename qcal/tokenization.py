"""What a tokenizer puts in front of every text, so windows look like the model's inputs.

Some models are trained with a beginning-of-sequence token on every sequence and are
far off without it (Gemma 3: perplexity 65 without ``<bos>``, 25 with it on the same
text); others (SmolLM2, GPT-2) add nothing. qcal cuts text into windows itself, with
``add_special_tokens=False``, so it asks the tokenizer once what it would prepend and
gives every calibration and evaluation window that prefix. A tokenizer that prepends
nothing leaves every window, cache key and number as it was.
"""

from __future__ import annotations

from typing import Any

_PROBE = "The quick brown fox"


def text_prefix(tokenizer: Any) -> list[int]:
    """The special token ids the tokenizer prepends to a text by default ([] if none)."""
    try:
        with_special = list(tokenizer(_PROBE)["input_ids"])
        plain = list(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    except (TypeError, KeyError, ValueError):  # not a HF tokenizer: nothing to prepend
        return []
    # Only a leading prefix counts: trailing EOS tokens (some tokenizers add one) would end
    # every window early.
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start:start + len(plain)] == plain:
            return [int(t) for t in with_special[:start]]
    return []
