"""Shared-context scoring gives lm-eval's own log-likelihoods, request by request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration


def _lms(model_dir: Path, device: str = "cpu") -> tuple:
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qcal.eval.shared_context import SharedContextHFLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    return (HFLM(pretrained=model, tokenizer=tok, batch_size=4, device=device),
            SharedContextHFLM(pretrained=model, tokenizer=tok, batch_size=4, device=device))


def _requests(vocab: int, max_length: int) -> list:
    gen = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    out = []
    # Two 20-token contexts with different numbers of choices share one batch.
    for ctx_len, conts in [(5, [1, 1, 3]), (20, [4, 2, 7, 1]), (3, [1, 1]), (11, [6]),
                           (20, [2, 5]), (5, [1, 1])]:
        context = toks(ctx_len)
        out += [(("c", f"k{len(out)}"), context, toks(n)) for n in conts]
    # Longer than the model takes: lm-eval truncates from the left; shared with another.
    long_ctx = toks(max_length)
    out += [(("c", "long"), long_ctx, toks(2)), (("c", "long2"), long_ctx, toks(1))]
    # A continuation that is the model's own greedy pick, so is_greedy is True somewhere.
    return out


def _greedy_request(lm, context: list[int], steps: int) -> tuple:
    ids = list(context)
    for _ in range(steps):
        with torch.no_grad():
            ids.append(int(lm.model(torch.tensor([ids], device=lm.device)).logits[0, -1].argmax()))
    return (("c", "greedy"), context, ids[len(context):])


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_shared_context_equals_lm_eval_per_request(arch: str, device: str, tiny_model_dir: Path,
                                                   tmp_path: Path) -> None:
    from qcal.model.tiny import build_tiny_gemma3

    # Gemma's sliding window (8 tokens) is shorter than the contexts: the cached pass must
    # mask the far context for the sliding layer exactly as the single pass does.
    model_dir = tiny_model_dir if arch == "llama" else build_tiny_gemma3(tmp_path / "g")
    reference, shared = _lms(model_dir, device)
    requests = _requests(reference.model.config.vocab_size, reference.max_length)
    context = requests[3][1]
    requests += [_greedy_request(reference, context, 3), (("c", "other"), context, [5, 6])]
    want = reference._loglikelihood_tokens(requests, disable_tqdm=True)
    got = shared._loglikelihood_tokens(requests, disable_tqdm=True)
    assert len(got) == len(want) == len(requests)
    for (ll_got, greedy_got), (ll_want, greedy_want) in zip(got, want, strict=True):
        assert ll_got == pytest.approx(ll_want, abs=2e-4)
        assert greedy_got == greedy_want
    assert any(g for _, g in want)  # the greedy request checks the True branch


def test_a_model_without_logits_to_keep_scores_the_same(tiny_model_dir: Path) -> None:
    reference, shared = _lms(tiny_model_dir)
    model = shared.model
    full_forward = model.forward
    calls = []

    def forward_without_logits_to_keep(input_ids=None, attention_mask=None, cache=None,
                                       use_cache=None):
        # An architecture whose forward has no logits_to_keep: passing it is a TypeError.
        calls.append(input_ids.shape)
        return full_forward(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                            use_cache=use_cache)

    model.forward = forward_without_logits_to_keep  # the instance's forward, for this test
    requests = _requests(model.config.vocab_size, reference.max_length)
    got = shared._loglikelihood_tokens(requests, disable_tqdm=True)
    del model.forward
    want = reference._loglikelihood_tokens(requests, disable_tqdm=True)
    assert calls, "the scorer did not go through the patched forward"
    for (ll_got, greedy_got), (ll_want, greedy_want) in zip(got, want, strict=True):
        assert ll_got == pytest.approx(ll_want, abs=2e-4)
        assert greedy_got == greedy_want


def test_a_score_store_resumes_an_interrupted_run(tiny_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from qcal.eval.score_store import ScoreStore, request_key

    _, shared = _lms(tiny_model_dir)
    requests = _requests(shared.model.config.vocab_size, shared.max_length)
    want = shared._loglikelihood_tokens(requests, disable_tqdm=True)
    identity = {"model": "tiny", "device": "cpu", "dtype": "torch.float32"}
    path = tmp_path / "scores.jsonl"
    # An interrupted run: it scored the first half of the requests before it was killed.
    first = requests[: len(requests) // 2]
    shared.score_store = ScoreStore(path, identity)
    shared._loglikelihood_tokens(first, disable_tqdm=True)

    store = ScoreStore(path, identity)  # the next run reads what the first one kept
    added: list[str] = []
    real_add = store.add
    store.add = lambda key, answer: (added.append(key), real_add(key, answer))[1]
    shared.score_store = store
    got = shared._loglikelihood_tokens(requests, disable_tqdm=True)
    kept = {request_key(ctx, cont) for _, ctx, cont in first}
    assert f"{len(first)} of {len(requests)} requests already scored" in capsys.readouterr().err
    assert sorted(added) == sorted({request_key(c, k) for _, c, k in requests} - kept)
    for (ll_got, greedy_got), (ll_want, greedy_want) in zip(got, want, strict=True):
        assert ll_got == pytest.approx(ll_want, abs=2e-4) and greedy_got == greedy_want
    added.clear()
    assert shared._loglikelihood_tokens(requests, disable_tqdm=True) == got and not added


def test_tasks_give_lm_eval_items_and_metrics(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qcal.eval.harness import run_tasks, task_manager

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = ["qcal_nextsent_en"]
    runs = [run_tasks(model, tok, tasks, task_manager(names=tasks), batch_size=4, limit=12,
                      share_contexts=flag) for flag in (False, True)]
    plain, shared = runs
    assert [r.doc_id for r in shared.items[tasks[0]]] == [r.doc_id for r in plain.items[tasks[0]]]
    for a, b in zip(plain.items[tasks[0]], shared.items[tasks[0]], strict=True):
        assert a.gold == b.gold and a.lengths == b.lengths
        assert b.lls == pytest.approx(a.lls, abs=2e-4)
    assert shared.metrics[tasks[0]]["acc,none"] == plain.metrics[tasks[0]]["acc,none"]
    assert (plain.info["scorer"], shared.info["scorer"]) == (
        "HFLM", "SharedContextHFLM (qcal.eval.shared_context)")


def test_batches_of_contexts_respect_the_cache_budget(monkeypatch) -> None:
    from qcal.eval import shared_context

    monkeypatch.setattr(shared_context, "TOKENS_PER_ROW", 10)  # budget: size x 10 tokens
    contexts = [(i,) * 5 for i in range(7)]
    rows = {c: 3 if c[0] in (1, 2) else 1 for c in contexts}
    chunks = list(shared_context._chunks(contexts, 4, 5, rows.get))
    # Budget 4 x 10 = 40 tokens: contexts 0-3 copy 1+3+3+1 = 8 rows of 5 tokens = 40 (fits,
    # and the batch is full at 4 contexts); 4-6 follow. A 100-token row alone is over budget.
    assert chunks == [contexts[0:4], contexts[4:7]]
    assert list(shared_context._chunks(contexts[:2], 4, 100, rows.get)) == [[contexts[0]],
                                                                             [contexts[1]]]
