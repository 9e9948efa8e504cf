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


@dataclasses.dataclass
class DriftOnText:
    base: PerplexityResult
    model: PerplexityResult
    kl: torch.Tensor  # float32 [tokens], nats
    js: torch.Tensor  # float32 [tokens], nats

    def summary(self) -> dict[str, Any]:
        worse = float((self.model.token_nll > self.base.token_nll).float().mean())
        return {
            "base_ppl": self.base.ppl, "model_ppl": self.model.ppl,
            "ppl_delta": self.model.ppl - self.base.ppl,
            "ppl_ratio": self.model.ppl / self.base.ppl,
            "kl_mean": float(self.kl.double().mean()), "js_mean": float(self.js.double().mean()),
            "kl_p95": float(torch.quantile(self.kl.double(), 0.95)),
            "js_max_nats": LN2,
            "tokens_nll_worse": worse,
            "tokens": int(self.kl.numel()),
        }


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
    nb, nm, kls, jss = [], [], [], []
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
        for r in range(0, lp.shape[0], ROW_CHUNK):
            kl, js = token_divergence(lp[r:r + ROW_CHUNK], lq[r:r + ROW_CHUNK])
            kls.append(kl.float())
            jss.append(js.float())
    mode = "fixed" if stride is None else f"stride{stride}"
    return DriftOnText(_result(nb, len(spans), seqlen, mode), _result(nm, len(spans), seqlen, mode),
                       torch.cat(kls), torch.cat(jss))
