#!/usr/bin/env python
"""Perplexity evaluation's scoring step: the flattened cross-entropy it used before
`qcal.scoring.next_token_nll` vs row by row; writes results/window_nll.{json,md}.

The earlier `window_nll` flattened `logits[:, :-1]`, which copies the whole logit tensor
before the cross-entropy (2 GB per batch of 4 x 512 tokens for Gemma-3's 262k-token
vocabulary). Both ways give the same bits (checked here on every batch). Timed per batch
of held-out handbook windows (the evaluation's own windows and batch size), forward pass
included, the two ways interleaved in one process.

    python scripts/bench_window_nll.py [--models smollm2-135m-instruct,gemma-3-270m]
        [--windows 16] [--repeats 2] [--out results/window_nll]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from statistics import median
from typing import Any

from qcal.paths import results_dir
from qcal.studies.bench import load_average, provenance, write_results
from qcal.studies.bench_tables import BATCH, SEQLEN, render_window_nll
from qcal.studies.comparisons import flattened_nll


def bench_model(name: str, windows: int, repeats: int) -> dict[str, Any]:
    import torch

    from qcal.data import eval_text
    from qcal.eval.perplexity import text_spans, tokenize_text, with_prefix
    from qcal.model.loading import load_model
    from qcal.scoring import next_token_nll
    from qcal.tokenization import text_prefix

    model, tok, _ = load_model(name)
    ids = tokenize_text(tok, eval_text("en", source="debian-handbook"))
    prefix = text_prefix(tok)
    spans = text_spans(ids.numel(), SEQLEN, None, prefix)[:windows]
    batches = [torch.stack([with_prefix(ids[s:e], prefix) for s, e, _ in spans[i:i + BATCH]])
               for i in range(0, len(spans), BATCH)]
    seconds: dict[str, list[float]] = {"flattened": [], "row by row": []}
    identical = True
    for _ in range(repeats):
        for batch in batches:
            out = {}
            for arm, score in (("flattened", flattened_nll), ("row by row", next_token_nll)):
                start = time.perf_counter()
                with torch.no_grad():
                    out[arm] = score(model(input_ids=batch).logits, batch)
                seconds[arm].append(time.perf_counter() - start)
            identical &= bool(torch.equal(out["flattened"], out["row by row"]))
    return {"model": name, "vocab": int(model.config.vocab_size), "batches": len(batches),
            "repeats": repeats, "seconds": seconds, "identical": identical,
            "median": {arm: median(v) for arm, v in seconds.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=results_dir() / "window_nll")
    args = p.parse_args()
    load_before = load_average()
    models = [bench_model(m, args.windows, args.repeats) for m in args.models.split(",")]
    load_after = load_average()
    command = (f"python scripts/bench_window_nll.py --models {args.models} --windows "
               f"{args.windows} --repeats {args.repeats}")
    data = {"provenance": provenance(command=command), "load_before": load_before,
            "load_after": load_after, "models": models, "windows": args.windows}
    write_results(args.out.resolve(), data, render_window_nll(data))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
