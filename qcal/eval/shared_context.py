"""lm-eval's HF model, scoring the choices of a multiple-choice item on one shared context.

lm-eval's `HFLM` runs context + continuation through the model once per request (once per
context only when every continuation is a single token) and takes the log-softmax over the
whole vocabulary at every position of the batch. A multiple-choice item asks for k
continuations of one context, so most of that work repeats the context, and on a model
with a large vocabulary (Gemma-3's 262k tokens) most of the rest goes into logits nobody
reads. `SharedContextHFLM` changes only how those requests are computed:

- requests are grouped by their context tokens; a context with two or more continuations
  runs once, keeping its KV cache and the logits of its last position only; contexts of
  equal length run together as one unpadded batch;
- each cache row is copied once per continuation of its context and the continuations
  (but their last token) run on it as one right-padded batch: each real token attends to
  its context and to the tokens before it in its own continuation, exactly as in
  lm-eval's single pass;
- log-likelihood and greedy match per request as lm-eval defines them (sum of the
  continuation tokens' log-probabilities; every token the argmax).

Everything else, including requests whose context no other request shares, requests lm-eval
would truncate from the left and rolling log-likelihoods, goes through `HFLM` unchanged.
With a score store (`qcal.eval.score_store`), every score is kept on disk as it is
computed and requests already there are not computed again: an interrupted run resumes.
The tasks, requests, metrics and the answers' order are lm-eval's: the numbers equal
lm-eval's up to floating-point rounding of the different batch shapes
(tests/integration/test_shared_context.py compares them request by request).
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM
from tqdm.auto import tqdm

from qcal.eval.score_store import ScoreStore, request_key

Request = tuple[tuple[str, str], list[int], list[int]]


class SharedContextHFLM(HFLM):
    """`HFLM` whose log-likelihood requests share each context's forward pass; with a
    `score_store` (`qcal.eval.score_store.ScoreStore`) each score is saved as it is
    computed and a request already in the store is not computed again."""

    def __init__(self, *args: Any, score_store: ScoreStore | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.score_store = score_store

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        if self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        store = self.score_store
        keys = [request_key(ctx, cont) for _, ctx, cont in requests] if store else []
        answers: list[tuple[float, bool] | None] = (
            [store.get(k) for k in keys] if store else [None] * len(requests))

        def done(index: int, answer: tuple[float, bool]) -> None:
            answers[index] = answer
            if store is not None:
                store.add(keys[index], answer)
            if requests[index][0] is not None:
                self.cache_hook.add_partial("loglikelihood", requests[index][0], answer)

        todo = [i for i, a in enumerate(answers) if a is None]
        if store is not None and len(todo) < len(requests) and self.rank == 0:
            print(f"lm-eval scores: {len(requests) - len(todo)} of {len(requests)} requests "
                  f"already scored in {store.path}; scoring the other {len(todo)}",
                  file=sys.stderr, flush=True)
        by_context: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index in todo:
            _, context, continuation = requests[index]
            if context and continuation and len(context) + len(continuation) <= self.max_length + 1:
                by_context[tuple(context)].append(index)
        shared = {ctx: idx for ctx, idx in by_context.items() if len(idx) > 1}
        in_shared = {i for idx in shared.values() for i in idx}
        rest = [i for i in todo if i not in in_shared]
        # lm-eval's own path, in slices so that a store keeps what each slice computed.
        step = REST_SLICE if store is not None else max(len(rest), 1)
        for start in range(0, len(rest), step):
            part = rest[start:start + step]
            for i, answer in zip(part, super()._loglikelihood_tokens(
                    [requests[i] for i in part], disable_tqdm, override_bs), strict=True):
                answers[i] = answer  # HFLM has told lm-eval's cache hook itself
                if store is not None:
                    store.add(keys[i], answer)
            if store is not None:
                store.flush()
        bar = tqdm(total=len(in_shared), disable=disable_tqdm or self.rank != 0,
                   desc="Scoring shared-context requests")
        # Contexts of one length batch without padding (so nothing changes what a token
        # sees); longest first, as lm-eval orders its batches.
        by_length: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for context in shared:
            by_length[len(context)].append(context)
        size = self.batch_size if isinstance(self.batch_size, int) and self.batch_size > 0 else 16
        for length in sorted(by_length, reverse=True):
            for chunk in _chunks(by_length[length], size, length,
                                 lambda c: sum(len(requests[i][2]) > 1 for i in shared[c])):
                groups = [[requests[i][2] for i in shared[c]] for c in chunk]
                for context, scored in zip(chunk, self._score_groups(chunk, groups), strict=True):
                    for i, answer in zip(shared[context], scored, strict=True):
                        done(i, answer)
                    bar.update(len(shared[context]))
                if store is not None:
                    store.flush()
        bar.close()
        return [a for a in answers if a is not None]

    def _forward(self, **kwargs: Any) -> Any:
        autocast = (torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype)
                    if self.mixed_precision_dtype is not None else contextlib.nullcontext())
        with torch.no_grad(), autocast:
            return self.model(**kwargs)

    def _score_groups(self, contexts: list[tuple[int, ...]], groups: list[list[list[int]]]
                      ) -> list[list[tuple[float, bool]]]:
        """(log-likelihood, greedy) of every continuation in `groups[g]` after `contexts[g]`
        (all contexts of one length)."""
        ids = torch.tensor(contexts, dtype=torch.long, device=self.device)
        try:
            head = self._forward(input_ids=ids, use_cache=True, logits_to_keep=1)
        except TypeError:  # a model class without logits_to_keep: all positions, last one used
            head = self._forward(input_ids=ids, use_cache=True)
        # Log-probabilities of each continuation's first token, from its context's last position.
        first = F.log_softmax(head.logits[:, -1], dim=-1, dtype=self.softmax_dtype)
        # Single-token continuations are done: only the longer ones run on the cache.
        rows = [(g, j) for g, conts in enumerate(groups) for j, cont in enumerate(conts)
                if len(cont) > 1]
        rest = None
        if rows:
            longest = max(len(groups[g][j]) for g, j in rows)
            cache = head.cache  # transformers 5 names the KV cache `cache`
            # One cache row per continuation, copied from its context's row.
            cache.batch_select_indices(torch.tensor([g for g, _ in rows], device=self.device))
            # Every continuation but its last token, right-padded: padding sits after the real
            # tokens, so under the causal mask no real token sees it (as in lm-eval's batches).
            tails = torch.zeros((len(rows), longest - 1), dtype=torch.long, device=self.device)
            for r, (g, j) in enumerate(rows):
                cont = groups[g][j]
                tails[r, :len(cont) - 1] = torch.tensor(cont[:-1], dtype=torch.long)
            out = self._forward(input_ids=tails, cache=cache, use_cache=True)
            rest = F.log_softmax(out.logits, dim=-1, dtype=self.softmax_dtype)
        answers: list[list[tuple[float, bool]]] = [[] for _ in groups]
        row_of = {gj: r for r, gj in enumerate(rows)}
        for g, conts in enumerate(groups):
            for j, cont in enumerate(conts):
                answers[g].append(self._answer(first[g], rest, row_of.get((g, j)), cont))
        return answers

    @staticmethod
    def _answer(first: torch.Tensor, rest: torch.Tensor | None, row: int | None,
                cont: list[int]) -> tuple[float, bool]:
        """lm-eval's (sum of the continuation's log-probabilities, all tokens greedy)."""
        logprob = float(first[cont[0]])
        greedy = int(first.argmax()) == cont[0]
        if len(cont) > 1:
            assert rest is not None and row is not None
            steps = rest[row, :len(cont) - 1]
            target = torch.tensor(cont[1:], dtype=torch.long, device=steps.device)
            logprob += float(steps.gather(1, target[:, None]).sum())
            greedy = greedy and bool((steps.argmax(dim=-1) == target).all())
        return logprob, greedy


# Cache rows x context tokens one batch may copy, per unit of batch size: with the default
# batch of 16, 16 rows of 1,024 tokens (a few hundred MB of keys and values for a small model).
TOKENS_PER_ROW = 1024
# Requests per call of lm-eval's own path when a score store keeps the results: a kill
# loses at most one slice.
REST_SLICE = 512


def _chunks(contexts: list[tuple[int, ...]], size: int, length: int,
            tail_rows: Callable[[tuple[int, ...]], int]) -> Iterator[list[tuple[int, ...]]]:
    """Batches of at most `size` contexts (all `length` long) whose copied cache rows stay
    within size x TOKENS_PER_ROW tokens; a context that alone exceeds it runs alone."""
    budget = size * TOKENS_PER_ROW
    chunk: list[tuple[int, ...]] = []
    rows = 0
    for context in contexts:
        need = tail_rows(context)
        if chunk and (len(chunk) == size or (rows + need) * length > budget):
            yield chunk
            chunk, rows = [], 0
        chunk.append(context)
        rows += need
    if chunk:
        yield chunk
