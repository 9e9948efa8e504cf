#!/usr/bin/env python
"""What calibration selection costs: zipf vs perplexity-based selection as the ZipCal grids
run them, and the perplexity selector before and after its scoring fix; writes
results/selection_cost.{json,md}.

The study grids (configs/study_zipcal*.yaml) select with `zipf:pool_size=256` and
`perplexity:max_candidates=256,score_tokens=128` from the English handbook pool. Until
this change the perplexity selector took its cross-entropy over the class axis of a
transposed view of the logits, a strided softmax several times slower (and less accurate
in float32) than scoring each row's contiguous logits (`qcal.scoring.next_token_nll`).
The default model's ZipCal cells were selected that way, so their recorded cost
overstates what the selector costs now. This script times, in one process and one run,
each of: zipf, perplexity as it is now, and perplexity with the old scoring patched back
in ("transposed CE"), through `qcal.calib.resolve_calib` exactly as a grid cell does
(reference model loaded from the model directory, selection timing from the manifest),
and says whether old and new scoring chose the same windows.

    python scripts/bench_selection_cost.py [--models smollm2-135m-instruct]
        [--nsamples 16,128] [--seeds 0,1,2] [--out results/selection_cost]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import median
from typing import Any

from qcal.paths import results_dir
from qcal.studies.bench import load_average, provenance, write_results
from qcal.studies.bench_tables import SELECTION_ARMS as ARMS
from qcal.studies.bench_tables import SELECTION_SOURCE as SOURCE
from qcal.studies.bench_tables import SEQLEN, render_selection_cost
from qcal.studies.comparisons import transposed_nll


def select(tokenizer: Any, arm: str, n: int, seed: int) -> dict[str, Any]:
    import qcal.calib.perplexity as ppl_module
    from qcal.calib import resolve_calib

    current = ppl_module.next_token_nll
    if arm.endswith("transposed CE"):
        ppl_module.next_token_nll = transposed_nll
    try:
        load = load_average()
        calib = resolve_calib(SOURCE, tokenizer, nsamples=n, seqlen=SEQLEN, seed=seed,
                              selector=ARMS[arm])
    finally:
        ppl_module.next_token_nll = current
    timing = calib.manifest["timing"]
    return {"arm": arm, "n": n, "seed": seed, "seconds": timing["selection_seconds"],
            "reference_load_seconds": (calib.manifest.get("selection") or {}).get(
                "reference_load_seconds"),
            "load_before": load, "digest": calib.manifest["digest"]}


def bench_model(name: str, nsamples: list[int], seeds: list[int]) -> dict[str, Any]:
    from qcal.model.loading import load_model

    _, tokenizer, model_dir = load_model(name)
    runs = []
    for seed in seeds:
        for n in nsamples:
            for arm in ARMS:  # interleaved, so drifting load hits every arm alike
                runs.append(select(tokenizer, arm, n, seed))
                print(f"{name} seed={seed} n={n} {arm}: {runs[-1]['seconds']} s", flush=True)
    med = {arm: median(r["seconds"] for r in runs if r["arm"] == arm) for arm in ARMS}
    old, new = ([r for r in runs if r["arm"] == a] for a in ("perplexity, transposed CE",
                                                             "perplexity"))
    same = sum(a["digest"] == b["digest"] for a, b in zip(old, new, strict=True))
    return {"model": name, "model_dir": str(model_dir), "runs": runs, "median_seconds": med,
            "same_selection": same, "compared": len(new)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--nsamples", default="16,128")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", type=Path, default=results_dir() / "selection_cost")
    args = p.parse_args()
    nsamples = [int(x) for x in args.nsamples.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    models = [bench_model(m, nsamples, seeds) for m in args.models.split(",")]
    command = ("python scripts/bench_selection_cost.py --models " + args.models
               + f" --nsamples {args.nsamples} --seeds {args.seeds}")
    data = {"provenance": provenance(command=command), "models": models}
    write_results(args.out.resolve(), data, render_selection_cost(data))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
