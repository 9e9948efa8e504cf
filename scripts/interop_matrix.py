#!/usr/bin/env python
"""Which loader reads which qcal checkpoint format, and do the logits agree?

Quantizes the default model once per symmetry and act-order (GPTQ w4, the automatic group
size, --nsamples x --calib-seqlen calibration windows, 16 x 512 by default; act-order as
--desc-act --static-groups, the form every format stores), writes it in every format
(`qcal quantize --format gptq`, then `qcal export` to gptq_v2, compressed-tensors and AWQ),
and loads each with every loader available here:
qcal, bare `AutoModelForCausalLM.from_pretrained(path)` (no extra argument), and the
`lm_eval --model hf` CLI (`--limit 5` of a packaged task); logits on fixed held-out English
windows are compared with qcal's own float32 load of the GPTQ checkpoint (max |diff| /
max |logit|, top-1 agreement). Writes results/interop.{json,md}.

    python scripts/interop_matrix.py [--nsamples 4 --calib-seqlen 128]

GPTQModel (its own venv) is measured by scripts/bench_peers.py --loaders; vLLM needs a CUDA
GPU and is listed as not run here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from qcal.cli import command_prefix
from qcal.data import eval_text
from qcal.eval.perplexity import tokenize_text
from qcal.model.loading import load_tokenizer, resolve_model_dir
from qcal.paths import qcal_home, results_dir, runs_dir
from qcal.studies.bench import provenance, write_results
from qcal.studies.bench_tables import interop_row, render_interop
from qcal.studies.interop import agreement, lm_eval_cli, logits_of
from qcal.studies.peers import peer_venv

FORMATS = ("gptq", "gptq_v2", "compressed-tensors", "awq")


def qcal_cli(*args: str) -> None:
    cmd = [*command_prefix(), *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=qcal_home())


def make_checkpoints(work: Path, sym: bool, act: bool, nsamples: int,
                     calib_seqlen: int, model: Path | None) -> dict[str, Path]:
    tag = ("sym" if sym else "asym") + ("-actorder" if act else "")
    prefix = f"{model.name}-" if model is not None else ""
    gptq = work / f"gptq-{prefix}{tag}-n{nsamples}-s{calib_seqlen}"
    if not (gptq / "quant_log.json").is_file():
        qcal_cli("quantize", *(["--model", str(model)] if model is not None else []),
                 "--method", "gptq", "--nsamples", str(nsamples), "--seqlen", str(calib_seqlen),
                 "--format", "gptq", *(["--sym"] if sym else []),
                 *(["--desc-act", "--static-groups"] if act else []), "-o", str(gptq),
                 "--overwrite")
    out = {"gptq": gptq}
    for fmt in FORMATS[1:]:
        out[fmt] = work / f"{fmt}-{gptq.name.removeprefix('gptq-')}"
        if not (out[fmt] / "quant_log.json").is_file():
            qcal_cli("export", "--model", str(gptq), "--format", fmt, "-o", str(out[fmt]),
                     "--overwrite")
    return out


PEER_LOADER = "GPTQModel 7.6 (own venv, torch kernel, bf16)"
LM_EVAL = "lm_eval --model hf (CLI, --limit 5)"
LOADERS = {
    "gptq": ["qcal", "transformers", LM_EVAL, PEER_LOADER],
    "gptq_v2": ["qcal", "transformers", LM_EVAL, PEER_LOADER],
    "compressed-tensors": ["qcal", "transformers", LM_EVAL],
    "awq": ["qcal", "transformers", LM_EVAL],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--nsamples", type=int, default=16, help="calibration windows")
    parser.add_argument("--tiny", action="store_true",
                        help="use qcal's tiny random Llama (built under --work) instead of the "
                             "default model: the whole matrix in minutes")
    parser.add_argument("--calib-seqlen", type=int, default=512, help="calibration window tokens")
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--work", type=Path, default=runs_dir() / "interop")
    parser.add_argument("--out", type=Path, default=results_dir() / "interop")
    args = parser.parse_args()
    model = None
    if args.tiny:
        from qcal.model.tiny import build_tiny_llama

        model = args.work / "tiny-llama"
        if not (model / "config.json").is_file():
            build_tiny_llama(model)
    tok = load_tokenizer(resolve_model_dir(model))
    ids = tokenize_text(tok, eval_text("en"))
    windows = ids[: args.windows * args.seqlen].reshape(args.windows, args.seqlen)
    data = []
    for sym, act in [(s, a) for s in (False, True) for a in (False, True)]:
        ckpts = make_checkpoints(args.work, sym, act, args.nsamples, args.calib_seqlen, model)
        ref = logits_of("qcal", ckpts["gptq"], windows, torch.float32)
        for fmt, path in ckpts.items():
            for loader in LOADERS[fmt]:
                for dtype in (torch.float32, torch.bfloat16):
                    if loader != "qcal" and dtype != torch.float32:
                        continue
                    if loader == PEER_LOADER and not (peer_venv() / "bin" / "python").is_file():
                        continue
                    cell: dict[str, Any] = {"format": fmt, "sym": sym, "act_order": act,
                                            "loader": loader,
                                            "dtype": "bfloat16" if loader == PEER_LOADER
                                            else str(dtype).removeprefix("torch.")}
                    try:
                        if loader == LM_EVAL:
                            cell.update(lm_eval_cli(path, args.work))
                        else:
                            cell.update(agreement(ref, logits_of(loader, path, windows, dtype)))
                        cell["loads"] = "yes"
                    except Exception as err:  # noqa: BLE001  (the matrix records what fails)
                        cell["loads"] = "no"
                        cell["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
                    data.append(cell)
                    print(interop_row(cell), flush=True)
    prov = provenance(
        "python scripts/interop_matrix.py" + "".join(f" {a}" for a in sys.argv[1:]),
        model=("qcal's tiny random Llama (qcal.model.tiny.build_tiny_llama: 2 layers, hidden "
               "128)" if args.tiny else "default (SmolLM2-135M-Instruct, dequantized Q4_1)"),
        checkpoints=f"qcal quantize --method gptq --nsamples {args.nsamples} --seqlen "
                    f"{args.calib_seqlen} --format gptq [--sym] [--desc-act --static-groups] "
                    "(group size auto), then qcal export --format "
                    "gptq_v2|compressed-tensors|awq",
        comparison=f"logits on {args.windows} held-out English windows of {args.seqlen} tokens "
                   "vs qcal's float32 load of the GPTQ checkpoint")
    table = {"provenance": prov, "cells": data}
    write_results(args.out, table, render_interop(table))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
