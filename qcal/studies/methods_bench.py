"""The methods benchmark (issue 48): every quantization method qcal has, with and without
the Hadamard rotation, on the same calibration ids, scored by one scorer; each cell is one
`qcal quantize` and one `qcal eval --ppl --base` subprocess, timed under /usr/bin/time -v.

A cell's record (quantize wall/CPU seconds and peak RSS, perplexity per language, KL from
float) is kept in results/methods_cells/<model>/ (committed: cells are minutes to hours of
CPU each, and a fresh checkout resumes instead of redoing them); its checkpoint lives in
runs/ only while it is evaluated. Cells run scheme by scheme, cheapest methods first, so
an interrupted run has finished whole rows.

    python scripts/bench_methods.py [--models smollm2-135m-instruct] [--schemes w4g128,...]
        [--variants rtn,gptq,...] [--seeds 0] [--autoround-iters 20] [--max-cells N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from qcal.cli import command_prefix
from qcal.model.loading import resolve_model_dir
from qcal.paths import qcal_home, results_dir, runs_dir
from qcal.studies.bench import Steps, provenance, timed, write_results
from qcal.studies.methods_report import LANGS, render_methods
from qcal.studies.tables import shown

# label -> qcal quantize flags of the method (the rotated variant adds --rotate).
VARIANTS: dict[str, list[str]] = {
    "rtn": ["--method", "rtn"],
    "rtn-mse": ["--method", "rtn-mse"],
    "hqq": ["--method", "hqq"],
    "rtn-imatrix": ["--method", "rtn-imatrix"],
    "gptq": ["--method", "gptq", "--desc-act"],
    "gptq-imatrix": ["--method", "gptq", "--desc-act", "--imatrix-clip"],
    "gptaq": ["--method", "gptaq", "--desc-act"],
    "awq": ["--method", "awq"],
    "autoround": ["--method", "autoround"],
}
ROTATION = ["--rotate", "hadamard:0"]
# w4 g128 asym, w4 per-channel, w3 g128 (a group of 128 leaves a ragged last group where it
# does not divide a width, as the committed method grids did: the GPTQ layout stores it).
SCHEMES = {"w4g128": ["--bits", "4", "--group-size", "128"],
           "w4pc": ["--bits", "4", "--group-size", "-1"],
           "w3g128": ["--bits", "3", "--group-size", "128"]}
DATA_FREE = ("rtn", "rtn-mse", "hqq")
EVAL = ["--ppl", "--langs", ",".join(LANGS), "--max-windows", "8"]


def calib_flags(seed: int) -> list[str]:
    return ["--calib", "debian-handbook", "--nsamples", "32", "--seqlen", "512", "--seed",
            str(seed)]


def cell_key(scheme: str, variant: str, rotated: bool, seed: int) -> str:
    return f"{scheme}/{variant}{'+rot' if rotated else ''}/s{seed}"


def run_cell(model: Path, key: str, work: Path, autoround_iters: int) -> dict[str, Any]:
    """Quantize and evaluate one cell; the record names what it measured."""
    scheme, label, seed_tag = key.split("/")
    variant, rotated = label.removesuffix("+rot"), label.endswith("+rot")
    seed = int(seed_tag[1:])
    flags = [*VARIANTS[variant], *SCHEMES[scheme], "--format", "gptq", "--allow-ragged-groups"]
    if variant == "autoround":
        flags += ["--iters", str(autoround_iters)]
    if variant not in DATA_FREE:
        flags += calib_flags(seed)
    if rotated:
        flags += ROTATION
    ckpt = work / key.replace("/", "__")
    quantize = timed([*command_prefix(), "quantize", "--model", str(model), *flags, "-o",
                      str(ckpt), "--overwrite"], cwd=qcal_home())
    record: dict[str, Any] = {"flags": flags, "quantize": quantize}
    if quantize["returncode"] != 0:
        return {**record, "returncode": quantize["returncode"]}
    record["quantize_seconds"] = json.loads((ckpt / "quant_log.json").read_text())[
        "quantize_seconds"]
    stem = work / f"eval-{ckpt.name}"
    evaluation = timed([*command_prefix(), "eval", "--model", str(ckpt), "--base", str(model),
                        *EVAL, "-o", str(stem), "--overwrite"], cwd=qcal_home())
    record["eval"] = evaluation
    if evaluation["returncode"] == 0:
        data = json.loads(stem.with_suffix(".json").read_text())
        record["divergence"] = {lang: {k: d[k] for k in ("base_ppl", "model_ppl", "kl_mean")}
                                for lang, d in data["perplexity"]["divergence"].items()}
    shutil.rmtree(ckpt, ignore_errors=True)  # minutes to rebuild; disk is kept for the next
    return {**record, "returncode": evaluation["returncode"]}


def planned(schemes: list[str], variants: list[str], seeds: list[int]) -> list[str]:
    keys = []
    for scheme in schemes:
        for seed in seeds:
            for variant in variants:
                if variant in DATA_FREE and seed != seeds[0]:
                    continue  # no calibration data: one cell is every seed's
                keys += [cell_key(scheme, variant, False, seed), cell_key(scheme, variant, True,
                                                                        seed)]
    return keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--autoround-iters", type=int, default=20)
    p.add_argument("--max-cells", type=int, default=None, help="stop after this many new cells")
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args(argv)
    schemes, variants = args.schemes.split(","), args.variants.split(",")
    bad = [s for s in schemes if s not in SCHEMES] + [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown schemes/variants {bad}; schemes {list(SCHEMES)}, variants "
                         f"{list(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    tables: dict[str, Any] = {}
    new = 0
    for name in args.models.split(","):
        model = resolve_model_dir(name)
        cells = Steps(results_dir() / "methods_cells" / model.name,
                      {"model": model.name, "eval": EVAL, "autoround_iters": args.autoround_iters})
        work = runs_dir() / "bench_methods" / model.name
        work.mkdir(parents=True, exist_ok=True)
        for key in planned(schemes, variants, seeds):
            if args.render_only or (args.max_cells is not None and new >= args.max_cells):
                cells.get(key)  # what is cached joins the tables; nothing new runs
                continue
            if cells.get(key) is None:
                new += 1
            cells.run(key, lambda k=key, m=model, w=work: run_cell(m, k, w, args.autoround_iters))
        tables[model.name] = {"cells": cells.results, "path": shown(model, qcal_home())}
    command = " ".join(["python scripts/bench_methods.py",
                        *(argv if argv is not None else sys.argv[1:])])
    data = {"models": tables, "variants": VARIANTS, "schemes": SCHEMES, "rotation": ROTATION,
            "calibration": " ".join(calib_flags(0)) + " (random windows; seed per cell)",
            "eval": EVAL, "provenance": provenance(command=command)}
    out = results_dir() / "methods"
    write_results(out, data, render_methods(data))
    print(f"wrote {out}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
