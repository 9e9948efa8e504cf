"""Windows start with what the tokenizer prepends to a text (Gemma's <bos>), and only then."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from qcal.calib import CalibSetError, build_calib, build_windows
from qcal.calib.build import check_compatible
from qcal.calib.manifest import tokenizer_info
from qcal.data.corpus import Document
from qcal.eval.divergence import compare_on_ids
from qcal.eval.perplexity import perplexity_of_ids, window_spans
from qcal.model.tiny import stdlib_text
from qcal.tokenization import text_prefix

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def plain_tok(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def bos_tok(plain_tok: Any) -> Any:
    """The tiny tokenizer made to prepend <bos> to every text, as Gemma's does."""
    from tokenizers.processors import TemplateProcessing

    tok = copy.deepcopy(plain_tok)
    tok.add_special_tokens({"bos_token": "<bos>"})
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    return tok


class Recorder(nn.Module):
    """Uniform logits over `vocab`; remembers every batch it was given."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True) -> SimpleNamespace:
        self.seen.append(input_ids.clone())
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab) + self.dummy)


def test_text_prefix_finds_bos_only_where_the_tokenizer_adds_it(plain_tok: Any, bos_tok: Any
                                                                ) -> None:
    assert text_prefix(plain_tok) == []
    assert text_prefix(bos_tok) == [bos_tok.bos_token_id]
    assert "prefix" not in tokenizer_info(plain_tok)  # keys of prefix-free tokenizers unchanged
    assert tokenizer_info(bos_tok)["prefix"] == [bos_tok.bos_token_id]


def test_calibration_windows_start_with_bos_and_keep_seqlen(plain_tok: Any, bos_tok: Any) -> None:
    docs = [Document(t, "en", "stdlib", f"d{i}", "user") for i, t in enumerate(stdlib_text())]
    plain = build_windows(docs, plain_tok, 32)
    with_bos = build_windows(docs, bos_tok, 32)
    assert with_bos.ids.shape[1] == plain.ids.shape[1] == 32
    assert (with_bos.ids[:, 0] == bos_tok.bos_token_id).all()
    assert (plain.ids[:, 0] != bos_tok.bos_token_id).all()
    # The text after <bos> is cut exactly as before, 31 tokens at a time.
    assert torch.equal(with_bos.ids[0, 1:], build_windows(docs, plain_tok, 31).ids[0])
    assert with_bos.stats["prefix_tokens"] == [bos_tok.bos_token_id]
    assert "prefix_tokens" not in plain.stats


def test_saved_set_without_bos_is_refused_for_a_bos_tokenizer(plain_tok: Any, bos_tok: Any) -> None:
    docs = [Document(t, "en", "stdlib", f"d{i}", "user") for i, t in enumerate(stdlib_text())]
    calib = build_calib(docs, plain_tok, 4, 32, 0)
    calib.manifest["tokenizer"] = {k: v for k, v in tokenizer_info(bos_tok).items()
                                   if k != "prefix"}  # the same vocabulary, built before <bos>
    with pytest.raises(CalibSetError, match="rebuild it"):
        check_compatible(calib, bos_tok, 4, 32, "old-set")
    check_compatible(build_calib(docs, bos_tok, 4, 32, 0), bos_tok, 4, 32, "new-set")


@pytest.mark.parametrize("stride", [None, 8])
def test_perplexity_windows_carry_the_prefix_and_score_every_text_token(stride: int | None) -> None:
    ids = torch.arange(3, 3 + 40) % 30 + 3
    model = Recorder(50)
    res = perplexity_of_ids(model, ids, seqlen=16, stride=stride, batch_size=2, progress=False,
                            prefix=[1])
    assert all(b.shape[1] <= 16 and (b[:, 0] == 1).all() for b in model.seen)
    assert model.seen[0].shape[1] == 16 and torch.equal(model.seen[0][0, 1:], ids[:15])
    if stride is None:
        assert res.windows == 40 // 15 and res.tokens == res.windows * 15
    else:  # every text token scored exactly once, the first one from <bos> alone
        assert res.tokens == 40
    plain = perplexity_of_ids(Recorder(50), ids, seqlen=16, stride=stride, progress=False)
    assert plain.tokens == (40 // 16 * 15 if stride is None else 39)
    assert window_spans(40, 16, None) == window_spans(40, 16, None, 1)


def test_divergence_uses_the_same_prefixed_windows() -> None:
    ids = torch.arange(40) % 30 + 3
    drift = compare_on_ids(Recorder(50), Recorder(50), ids, seqlen=16, progress=False, prefix=[1])
    ppl = perplexity_of_ids(Recorder(50), ids, seqlen=16, progress=False, prefix=[1])
    assert drift.model.tokens == ppl.tokens == drift.kl.numel()
