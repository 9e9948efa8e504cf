#!/usr/bin/env python
"""Data-parallel GPTQ: 1 vs N processes on the default model, in one run.

Runs `qcal quantize --method gptq --nsamples S --seqlen 512 --nproc P` for each P under
/usr/bin/time -v (wall, peak RSS of the largest process), then scores both checkpoints
on the same held-out English windows and counts identical codes. Writes
results/scaling.{json,md}.

    python scripts/bench_scaling.py [--nproc 1 2] [--nsamples 32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qcal.cli import command_prefix
from qcal.eval.job import run_evaluation
from qcal.paths import results_dir, runs_dir
from qcal.run_config import EvalConfig
from qcal.studies.bench import provenance, timed, write_results
from qcal.studies.bench_tables import render_scaling
from qcal.studies.comparisons import identical_codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--nsamples", type=int, default=32)
    parser.add_argument("--eval-windows", type=int, default=16)
    parser.add_argument("--out", type=Path, default=results_dir() / "scaling")
    args = parser.parse_args()
    work = runs_dir() / "bench_scaling"
    runs: dict[int, dict[str, Any]] = {}
    for n in args.nproc:
        out = work / f"gptq-nproc{n}"
        cmd = ["quantize", "--method", "gptq", "--nsamples", str(args.nsamples), "--seqlen", "512",
               "--nproc", str(n), "--device", "cpu", "-o", str(out), "--overwrite"]
        run = timed([*command_prefix(), *cmd])
        if run["returncode"] != 0:
            raise SystemExit(f"qcal quantize --nproc {n} failed:\n{run['error_tail']}")
        log = json.loads((out / "quant_log.json").read_text())
        ppl = run_evaluation(out, EvalConfig(langs=("en",), max_windows=args.eval_windows),
                             progress=False, device="cpu").data["perplexity"]["model"]["en"]["ppl"]
        runs[n] = {"command": "qcal " + " ".join(cmd[:-3]), **run,
                   "quantize_seconds": log["quantize_seconds"], "ppl_en": ppl}
        print(n, runs[n], flush=True)
    first = args.nproc[0]
    for n, r in runs.items():
        r["identical_codes_vs_first"] = 1.0 if n == first else identical_codes(
            work / f"gptq-nproc{first}", work / f"gptq-nproc{n}")
    prov = provenance("python scripts/bench_scaling.py " + " ".join(sys.argv[1:]),
                      model="default (SmolLM2-135M-Instruct, dequantized Q4_1), GPTQ w4, group "
                            "size auto (64), no act-order",
                      calibration=f"debian-handbook English, random selector, {args.nsamples} x "
                                  "512 tokens, seed 0 (the same ids for every process count)",
                      evaluation=f"first {args.eval_windows} held-out English windows of 512")
    data = {"provenance": prov, "runs": runs}
    write_results(args.out, data, render_scaling(data))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
