#!/usr/bin/env python
"""Which loader reads which qcal checkpoint format, and do the logits agree?

Quantizes the default model once per symmetry (GPTQ w4, the automatic group size, 16 x 512
calibration windows), writes it in every format (`qcal quantize --format gptq`, then
`qcal export` to compressed-tensors and AWQ), and loads each with every loader available
here; logits on fixed held-out English windows are compared with qcal's own float32 load
of the GPTQ checkpoint (max |diff| / max |logit|, top-1 agreement). Writes
results/interop.{json,md}.

    python scripts/interop_matrix.py

GPTQModel (its own venv) is measured by scripts/bench_gptq_vs_peer.py; vLLM needs a CUDA
GPU and is listed as not run here.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import torch

from qcal.cli import command_prefix
from qcal.data import eval_text
from qcal.eval.perplexity import tokenize_text
from qcal.model.loading import load_model, load_tokenizer, resolve_model_dir
from qcal.paths import results_dir, runs_dir
from qcal.results import markdown_table, provenance, provenance_markdown, write_results

ROOT = Path(__file__).resolve().parent.parent

FORMATS = ("gptq", "gptq_v2", "compressed-tensors", "awq")
PEER = ROOT / "runs" / "peer-venv" / "bin" / "python"  # scripts/setup_peer_venv.sh
PEER_SCRIPT = ROOT / "tests" / "integration" / "peer" / "gptqmodel_logits.py"


def qcal_cli(*args: str) -> None:
    cmd = [*command_prefix(), *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def make_checkpoints(work: Path, sym: bool) -> dict[str, Path]:
    tag = "sym" if sym else "asym"
    gptq = work / f"gptq-{tag}"
    if not (gptq / "quant_log.json").is_file():
        qcal_cli("quantize", "--method", "gptq", "--nsamples", "16", "--seqlen", "512",
                 *(["--sym"] if sym else []), "-o", str(gptq), "--overwrite")
    out = {"gptq": gptq}
    for fmt in FORMATS[1:]:
        out[fmt] = work / f"{fmt}-{tag}"
        if not (out[fmt] / "quant_log.json").is_file():
            qcal_cli("export", "--model", str(gptq), "--format", fmt, "-o", str(out[fmt]),
                     "--overwrite")
    return out


def logits_of(loader: str, path: Path, windows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if loader.startswith("GPTQModel"):
        import tempfile

        from safetensors.torch import load_file, save_file

        with tempfile.TemporaryDirectory() as tmp:
            save_file({"ids": windows.contiguous()}, f"{tmp}/ids.safetensors")
            run = subprocess.run([str(PEER), str(PEER_SCRIPT), str(path), f"{tmp}/ids.safetensors",
                                  f"{tmp}/out.safetensors"], capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(run.stderr.strip().splitlines()[-1])
            return load_file(f"{tmp}/out.safetensors")["logits"]
    if loader == "qcal":
        net = load_model(path, dtype=dtype)[0]
    else:
        from transformers import AutoModelForCausalLM, CompressedTensorsConfig

        extra = ({"quantization_config": CompressedTensorsConfig(dequantize=True)}
                 if loader == "transformers (dequantize=True)" else {})
        net = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **extra).eval()
    with torch.no_grad():
        return net(windows).logits.float()


def agreement(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    return {"max_rel_diff": float((ref - got).abs().max() / ref.abs().max()),
            "top1_agree": float((ref.argmax(-1) == got.argmax(-1)).float().mean())}


PEER_LOADER = "GPTQModel 7.6 (own venv, torch kernel, bf16)"
LOADERS = {
    "gptq": ["qcal", "transformers", PEER_LOADER],
    "gptq_v2": ["qcal", PEER_LOADER],
    "compressed-tensors": ["qcal", "transformers", "transformers (dequantize=True)"],
    "awq": ["qcal", "transformers"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--work", type=Path, default=runs_dir() / "interop")
    parser.add_argument("--out", type=Path, default=results_dir() / "interop")
    args = parser.parse_args()
    tok = load_tokenizer(resolve_model_dir(None))
    ids = tokenize_text(tok, eval_text("en"))
    windows = ids[: args.windows * args.seqlen].reshape(args.windows, args.seqlen)
    rows, data = [], []
    for sym in (False, True):
        ckpts = make_checkpoints(args.work, sym)
        ref = logits_of("qcal", ckpts["gptq"], windows, torch.float32)
        for fmt, path in ckpts.items():
            for loader in LOADERS[fmt]:
                for dtype in (torch.float32, torch.bfloat16):
                    if loader != "qcal" and dtype != torch.float32:
                        continue
                    if loader == PEER_LOADER and not PEER.is_file():
                        continue
                    cell: dict[str, Any] = {"format": fmt, "sym": sym, "loader": loader,
                                            "dtype": "bfloat16" if loader == PEER_LOADER
                                            else str(dtype).removeprefix("torch.")}
                    try:
                        cell.update(agreement(ref, logits_of(loader, path, windows, dtype)))
                        cell["loads"] = "yes"
                    except Exception as err:  # noqa: BLE001  (the matrix records what fails)
                        cell["loads"] = "no"
                        cell["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
                    data.append(cell)
                    rows.append([fmt, "sym" if sym else "asym", loader, cell["dtype"], cell["loads"],
                                 cell.get("max_rel_diff", "-"), cell.get("top1_agree", "-"),
                                 cell.get("error", "").replace("|", "/")])
                    print(rows[-1], flush=True)
    prov = provenance(
        "python scripts/interop_matrix.py",
        model="default (SmolLM2-135M-Instruct, dequantized Q4_1)",
        checkpoints="qcal quantize --method gptq --nsamples 16 --seqlen 512 [--sym] (group size "
                    "auto = 64), then qcal export --format compressed-tensors|awq",
        comparison=f"logits on {args.windows} held-out English windows of {args.seqlen} tokens "
                   "vs qcal's float32 load of the GPTQ checkpoint")
    md = "\n\n".join([
        "# Checkpoint interoperability: format x loader x dtype (CPU)",
        provenance_markdown(prov),
        markdown_table(["format", "scheme", "loader", "dtype", "loads", "max rel diff",
                        "top-1 agree", "error"], rows, ".2e"),
        "Not run here: vLLM (needs a CUDA GPU: `scripts/gpu_check.sh` is where it belongs). "
        "GPTQModel 7.6.0 runs in its own venv (scripts/setup_peer_venv.sh) on its bf16 torch "
        "kernel; it refuses asymmetric GPTQ checkpoints in the v1 storage unless its own tools "
        "wrote them, and reads them as `--format gptq_v2` (true zero points). "
        "transformers 5.24 reads the GPTQ layout only through GPTQModel/optimum (not installed "
        "in qcal's environment by design) and the AWQ layout only through GPTQModel too, so "
        "those rows record the refusal. compressed-tensors 0.20.1's default (compressed) path "
        "sizes asymmetric zero points unpacked and refuses asymmetric pack-quantized files "
        "(ours, llm-compressor's and vLLM's layout alike); its `dequantize=True` path reads them.",
    ])
    write_results(args.out, {"provenance": prov, "cells": data}, md)
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
