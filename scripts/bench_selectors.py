"""Selection wall time of `zipf` vs `perplexity` on one candidate pool, in one run.

Both selectors get the same pool: `--docs` documents of the provisioned corpus
(seeded sample), cut into `--seqlen`-token windows with at most one window per
document (short documents packed), i.e. ZipCal's 128 x 128 setting by default.
Timed: `selector.select(pool, n, seed)` only. For zipf that includes mapping the
pool's tokens to concepts; for perplexity, scoring every candidate with the float
default model (exp of mean token CE, batched) and ranking. Loading the corpus,
tokenizing and loading the model are shared costs, reported separately. The
selected sets' lexical statistics are reported beside a random baseline.

    python scripts/bench_selectors.py            # writes results/selectors.{json,md}
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from qcal.calib.perplexity import PerplexitySelector
from qcal.calib.random_sel import RandomSelector
from qcal.calib.zipf import ZipfSelector
from qcal.studies.bench import clock, load_average, provenance, write_results
from qcal.studies.bench_tables import render_selectors
from qcal.studies.selector_cost import load_pool, set_stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="debian-handbook")
    p.add_argument("--langs", default="en,de,fr")
    p.add_argument("--docs", type=int, default=2000, help="documents in the pool (>= 2000)")
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--zipf-repeats", type=int, default=3)
    p.add_argument("--random-seeds", type=int, default=5)
    p.add_argument("--model", default=None, help="scorer (default: the provisioned default model)")
    p.add_argument("--out", default="results/selectors")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from qcal.model.loading import load_model

    args = parse_args(argv)
    if args.docs < 2000:
        print("note: the benchmark's claim needs --docs >= 2000", file=sys.stderr)
    (net, tokenizer, model_path), load_s = clock(lambda: load_model(args.model))
    langs = [x.strip() for x in args.langs.split(",") if x.strip()]
    pool, pool_info = load_pool(args.source, langs, args.docs, args.seqlen, args.seed, tokenizer)
    print(f"pool: {pool_info}", flush=True)

    zipf = ZipfSelector()
    zipf_runs = []
    for _ in range(max(1, args.zipf_repeats)):
        zsel, secs = clock(lambda: zipf.select(pool, args.n, args.seed))
        zipf_runs.append(secs)
    print(f"zipf: {zipf_runs}", flush=True)

    ppl = PerplexitySelector(mode="low", batch_size=args.batch_size, score_tokens=args.seqlen,
                             model=net)
    with torch.inference_mode():
        psel, ppl_s = clock(lambda: ppl.select(pool, args.n, args.seed))
    print(f"perplexity: {ppl_s:.1f} s", flush=True)

    zipf_first, zipf_median = zipf_runs[0], statistics.median(zipf_runs)
    rand = [set_stats(pool, RandomSelector().select(pool, args.n, s).indices)
            for s in range(args.random_seeds)]
    sets = {
        "zipf": set_stats(pool, zsel.indices),
        "perplexity-low": set_stats(pool, psel.indices),
        "random (mean over seeds)": {
            "types": statistics.mean(r["types"] for r in rand),
            "type_token_ratio": statistics.mean(r["type_token_ratio"] for r in rand),
            "zipf_exponent": statistics.mean(r["zipf_exponent"] for r in rand)},
    }
    timing = {"zipf_seconds_first": round(zipf_first, 4), "zipf_seconds_median": round(zipf_median, 4),
              "zipf_seconds_all": [round(s, 4) for s in zipf_runs],
              "perplexity_seconds": round(ppl_s, 2), "model_load_seconds": round(load_s, 2),
              "speedup_first": round(ppl_s / zipf_first, 1),
              "speedup_median": round(ppl_s / zipf_median, 1)}
    # End to end from documents: both tokenize and cut windows; perplexity also loads its model.
    win_s = pool_info["windowing_seconds"]
    timing["speedup_end_to_end"] = round((win_s + load_s + ppl_s) / (win_s + zipf_first), 1)
    prov = provenance(model=str(model_path), data=f"{args.source} calib split, langs {args.langs}",
                      torch_threads=torch.get_num_threads(),
                      load_average=load_average())
    setting = {"source": args.source, "n": args.n, "seqlen": args.seqlen, "score_tokens": args.seqlen,
               "batch_size": args.batch_size, "seed": args.seed, "zipf_pool_size": zipf.pool_size}
    data = {"provenance": prov, "setting": setting, "pool": pool_info, "timing": timing,
            "selected": {"zipf": zsel.info, "perplexity": psel.info}, "sets": sets}

    write_results(Path(args.out), data, render_selectors(data))
    print(f"wrote {args.out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
