"""Does a calibration set contain the text it will be judged on? Word 13-gram overlap, as
contamination studies measure it (GPT-3's appendix C; llama.cpp's imatrix notes warn never
to calibrate on test data, and AutoGPTQ issue 650 shows WikiText-calibrated GPTQ scoring
6.62 on WikiText against 17.5 when calibrated on C4).

Pure functions over text: normalized words (lowercased, letters and digits only; CJK
characters count one word each, having no spaces), their n-grams hashed, and the share
of an evaluation text's n-grams that the calibration text holds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

NGRAM = 13
# A word: a run of letters/digits, or one CJK/kana/hangul character.
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]|[^\W_]+", re.UNICODE)
# An evaluation split overlapping the calibration set this much is flagged, when at least
# MIN_SHARED n-grams are shared: one boilerplate paragraph (a licence, a repeated docstring)
# in both is not a copied split.
FLAG_SHARE = 0.01
MIN_SHARED = 20


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def ngram_hashes(text: str, n: int = NGRAM) -> set[int]:
    """64-bit hashes of every word n-gram of `text` (a text shorter than n words: none)."""
    seq = words(text)
    out = set()
    for i in range(len(seq) - n + 1):
        digest = hashlib.blake2b(" ".join(seq[i:i + n]).encode(), digest_size=8).digest()
        out.add(int.from_bytes(digest, "little"))
    return out


def overlap(calib_texts: Iterable[str], eval_texts: Mapping[str, Iterable[str]],
            n: int = NGRAM) -> dict[str, dict[str, float | int | bool]]:
    """Per evaluation split: its n-grams, how many the calibration texts hold, that share of
    the split's (`share`) and of the set's (`set_share`: a small set copied from a large
    split covers little of the split but is made of it), and whether either reaches
    FLAG_SHARE with at least MIN_SHARED n-grams in common. Each evaluation document is
    hashed on its own, so no n-gram spans two."""
    calib: set[int] = set()
    for text in calib_texts:
        calib |= ngram_hashes(text, n)
    report = {}
    for name, docs in eval_texts.items():
        grams: set[int] = set()
        for doc in docs:
            grams |= ngram_hashes(doc, n)
        shared = len(grams & calib)
        share = shared / len(grams) if grams else 0.0
        set_share = shared / len(calib) if calib else 0.0
        report[name] = {"ngrams": len(grams), "shared": shared, "share": share,
                        "set_share": set_share,
                        "flagged": shared >= MIN_SHARED and max(share, set_share) >= FLAG_SHARE}
    return report
