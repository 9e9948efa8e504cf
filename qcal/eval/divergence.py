"""How far a quantized model's next-token distributions drift from its float base.

`token_divergence` is the pure part (KL and JS between two rows of log-probabilities);
`compare_on_ids` runs both models over the same windows as perplexity does, so the two
token-NLL streams and the divergences line up token by token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from qcal.errors import ConfigError
from qcal.eval.perplexity import PerplexityResult, text_spans, with_prefix

LN2 = math.log(2.0)
ROW_CHUNK = 64  # tokens per divergence step: temporaries stay ~13 MB each at vocab 49k


def token_divergence(logp: torch.Tensor, logq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row KL(P || Q) and JS(P, Q) in nats, from log-probabilities [N, V].

    P is the reference (float base), Q the approximation (quantized model). Float32:
    float64 triples the cost on CPU and moves the mean KL by far less than its spread.
    """
    logp, logq = logp.float(), logq.float()
    p, q = logp.exp(), logq.exp()

    def plogratio(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # 0 * log(0 / x) = 0: masked tokens (-inf logits) must not turn the sum into NaN
        return torch.where(w > 0, w * (a - b), torch.zeros_like(w)).sum(-1)

    kl = plogratio(p, logp, logq)
    # log of the mixture m = (p + q) / 2, computed stably in log space
    logm = torch.logaddexp(logp, logq) - LN2
    js = 0.5 * plogratio(p, logp, logm) + 0.5 * plogratio(q, logq, logm)
    return kl.clamp_min(0.0), js.clamp_min(0.0)


def reverse_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-row KL(Q || P) in nats: the quantized model's view, which weighs the tokens it
    puts mass on that the float model does not (llm-compressor RFC 2031 asks for both)."""
    return token_divergence(logq, logp)[0]


TOP_TOKENS = 10  # target tokens listed by their summed KL
WORST_SHARE = 0.01  # the share of positions whose KL share is reported
POSITION_BINS = 10  # deciles of the position within its window


def localization(kl: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor,
                 top: int = TOP_TOKENS) -> dict[str, Any]:
    """Where the divergence sits: the share of the total KL carried by the worst 1% of
    positions, the target tokens with the largest summed KL (with their count and mean),
    and the KL share per decile of the position within its window (pure; token ids only,
    the caller names them)."""
    kl = kl.double()
    total = float(kl.sum())
    n = kl.numel()
    worst = max(1, math.ceil(n * WORST_SHARE))
    sums = torch.zeros(int(targets.max()) + 1 if n else 1, dtype=torch.float64)
    counts = torch.zeros_like(sums)
    sums.index_add_(0, targets.long(), kl)
    counts.index_add_(0, targets.long(), torch.ones_like(kl))
    order = [t for t in torch.argsort(sums, descending=True)[:top].tolist() if counts[t] > 0]
    bins = (positions.double() * POSITION_BINS).long().clamp_(0, POSITION_BINS - 1)
    per_bin = torch.zeros(POSITION_BINS, dtype=torch.float64).index_add_(0, bins, kl)
    return {
        "worst_1pct_share": float(torch.topk(kl, worst).values.sum() / total) if total > 0
        else math.nan,
        "top_tokens": [{"token_id": t, "kl_sum": float(sums[t]), "count": int(counts[t]),
                        "kl_share": float(sums[t]) / total if total > 0 else math.nan}
                       for t in order],
        "kl_share_by_position_decile": [float(v / total) if total > 0 else math.nan
                                        for v in per_bin],
    }


@dataclasses.dataclass
class DriftOnText:
    base: PerplexityResult
    model: PerplexityResult
    kl: torch.Tensor  # float32 [tokens], nats: KL(float || quantized)
    js: torch.Tensor  # float32 [tokens], nats
    kl_reverse: torch.Tensor | None = None  # float32 [tokens], nats: KL(quantized || float)
    top1_agree: torch.Tensor | None = None  # bool [tokens]: both argmaxes equal
    targets: torch.Tensor | None = None  # int64 [tokens]: the token each position predicts
    positions: torch.Tensor | None = None  # float32 [tokens]: where in its window, in [0, 1)

    def summary(self) -> dict[str, Any]:
        worse = float((self.model.token_nll > self.base.token_nll).float().mean())
        out = {
            "base_ppl": self.base.ppl, "model_ppl": self.model.ppl,
            "ppl_delta": self.model.ppl - self.base.ppl,
            "ppl_ratio": self.model.ppl / self.base.ppl,
            "kl_mean": float(self.kl.double().mean()), "js_mean": float(self.js.double().mean()),
            "kl_p95": float(torch.quantile(self.kl.double(), 0.95)),
            "js_max_nats": LN2,
            "tokens_nll_worse": worse,
            "tokens": int(self.kl.numel()),
        }
        if self.kl_reverse is not None:
            out["kl_reverse_mean"] = float(self.kl_reverse.double().mean())
        if self.top1_agree is not None:
            out["top1_agreement"] = float(self.top1_agree.double().mean())
        if self.targets is not None and self.positions is not None:
            out["localization"] = localization(self.kl, self.targets, self.positions)
        return out


@torch.no_grad()
def _logprobs(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch, use_cache=False).logits
    return F.log_softmax(logits.float(), dim=-1)


def _result(pieces: list[torch.Tensor], n_windows: int, seqlen: int, mode: str
            ) -> PerplexityResult:
    nll = torch.cat(pieces)
    total = float(nll.double().sum())
    return PerplexityResult(ppl=math.exp(total / nll.numel()), nll_sum=total, tokens=nll.numel(),
                            windows=n_windows, seqlen=seqlen, mode=mode, token_nll=nll,
                            window_tokens=[p.numel() for p in pieces])


@torch.no_grad()
def compare_on_ids(
    base: nn.Module, model: nn.Module, ids: torch.Tensor, seqlen: int = 512,
    stride: int | None = None, max_windows: int | None = None, progress: bool = True,
    desc: str = "drift", prefix: Sequence[int] = (),
) -> DriftOnText:
    """Token NLL of both models plus per-token KL/JS, over perplexity's windows.

    One window at a time: two [seqlen, vocab] log-probability tensors are already large.
    """
    spans = text_spans(ids.numel(), seqlen, stride, prefix)[:max_windows]
    if not spans:
        raise ConfigError(f"the text has {ids.numel()} tokens, fewer than one window of "
                          f"seqlen={seqlen}; use a longer text or a smaller --seqlen")
    dev_b, dev_m = next(base.parameters()).device, next(model.parameters()).device
    nb, nm, kls, jss, rev, agree, targets, where = [], [], [], [], [], [], [], []
    for start, end, first in tqdm(spans, desc=desc, disable=not progress, leave=False):
        window = with_prefix(ids[start:end], prefix).unsqueeze(0)
        lp = _logprobs(base, window.to(dev_b))[0, :-1].cpu()
        lq = _logprobs(model, window.to(dev_m))[0, :-1].cpu()
        if lp.shape != lq.shape:
            raise ConfigError(f"the base model's vocabulary ({lp.shape[-1]}) differs from the "
                              f"model's ({lq.shape[-1]}); --base must be the model's float source")
        target = window[0, 1:]
        keep = slice(len(prefix) + first - 1, None)
        nb.append(-lp.gather(1, target[:, None])[:, 0][keep])
        nm.append(-lq.gather(1, target[:, None])[:, 0][keep])
        lp, lq = lp[keep], lq[keep]
        kept = target[keep]
        targets.append(kept)
        where.append(torch.arange(lp.shape[0], dtype=torch.float32).add_(
            len(prefix) + first - 1).div_(max(1, window.shape[1] - 1)))
        agree.append(lp.argmax(-1) == lq.argmax(-1))
        for r in range(0, lp.shape[0], ROW_CHUNK):
            kl, js = token_divergence(lp[r:r + ROW_CHUNK], lq[r:r + ROW_CHUNK])
            kls.append(kl.float())
            jss.append(js.float())
            rev.append(reverse_kl(lp[r:r + ROW_CHUNK], lq[r:r + ROW_CHUNK]).float())
    mode = "fixed" if stride is None else f"stride{stride}"
    return DriftOnText(_result(nb, len(spans), seqlen, mode), _result(nm, len(spans), seqlen, mode),
                       torch.cat(kls), torch.cat(jss), torch.cat(rev), torch.cat(agree),
                       torch.cat(targets), torch.cat(where))
