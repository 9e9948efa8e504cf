"""Benchmark the int4 kernels; writes results/kernels.{json,md}.

CPU part: torch's int4 CPU op (kernels/cpu.py), dequantize-then-GEMM and qcal's dispatch vs
float32 and bf16 `torch.matmul` at M = 1, 16, 64, 512 (K=N=4096), timed round-robin in one
run (median of --repeats);
end-to-end greedy decode tokens/s of the default model, float vs qcal RTN-w4 checkpoints
(made with `qcal quantize --method rtn` when missing), plus the perplexity cost of the
op's bf16 arithmetic.

GPU part (when CUDA is present): the Triton kernels (autotuned) vs `torch.matmul` fp16 at
M = 1, 16, 64, 256 and K = N = 4096, 8192, with achieved memory bandwidth as a fraction of
the device's peak.

Each part replaces its own section of the JSON file named by --merge (default: the output),
so the CPU run here and the GPU run on a lent machine end up in one table.

    python scripts/bench_kernels.py --part cpu
    python scripts/bench_kernels.py --part gpu --out $OUT/kernels --merge results/kernels.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from qcal.packing.qlinear import QuantLinear
from qcal.studies.bench import load_average, provenance, time_round_robin, write_results
from qcal.studies.kernels import (
    greedy_decode,
    kernel_cache_bytes,
    kernel_env,
    random_layer,
    weight_bytes,
)
from qcal.studies.kernels_report import render

PROMPT = ("The Debian Administrator's Handbook explains how to install, configure and maintain "
          "a Debian system. In this chapter we look at")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["auto", "cpu", "gpu"], default="auto",
                   help="auto: CPU part, plus the GPU part when CUDA is available")
    p.add_argument("--out", type=Path, default=Path("results/kernels"), help="output stem")
    p.add_argument("--merge", type=Path, default=None, help="JSON whose other sections to keep")
    p.add_argument("--repeats", type=int, default=7, help="timed samples per measurement (median)")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--groups", default="128,64", help="group sizes of the int4 checkpoints")
    p.add_argument("--runs-dir", type=Path, default=Path("runs/bench-kernels"))
    p.add_argument("--ppl-windows", type=int, default=4, help="512-token windows for the ppl check")
    p.add_argument("--skip-e2e", action="store_true", help="CPU matmuls only")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; 1 on a shared machine, where multi-thread barriers stall")
    return p.parse_args(argv)


MATMUL_TOKENS = (1, 16, 64, 512)


def cpu_matmuls(repeats: int) -> list[dict]:
    """Per shape (M tokens x K=N=4096): dense fp32/bf16, the int4 op, dequantize-then-GEMM
    (bf16, dequantized per call: what a model too big to cache runs), and what qcal's
    dispatch picks for bf16 inputs with no dequantized-weight cache."""
    from qcal_kernels.cpu import cpu_int4_matmul, pack_for_cpu
    from qcal_kernels.reference import dequantize_grouped_weight

    rows = []
    layer = random_layer(4096, 4096, 128)
    layer.cache_dequantized = False
    packed = pack_for_cpu(layer.qweight, layer.qzeros, layer.scales, layer.g_idx)
    w32 = layer.dequantized_weight()
    w16 = w32.to(torch.bfloat16)

    def dequant_gemm(x: torch.Tensor) -> torch.Tensor:  # float32 GEMM, as the dispatch does
        w = dequantize_grouped_weight(layer.qweight, layer.qzeros, layer.scales, 128, 4)
        return torch.nn.functional.linear(x.float(), w).to(x.dtype)

    for m in MATMUL_TOKENS:
        x32 = torch.randn(m, 4096)
        x16 = x32.to(torch.bfloat16)
        with torch.no_grad(), kernel_env(None):
            t = time_round_robin({
                "fp32 matmul": lambda x32=x32: torch.matmul(x32, w32.T),
                "bf16 matmul": lambda x16=x16: torch.matmul(x16, w16.T),
                "int4 op, bf16 x": lambda x16=x16: cpu_int4_matmul(x16, packed),
                "int4 op, fp32 x": lambda x32=x32: cpu_int4_matmul(x32, packed),
                "dequant+fp32 GEMM, bf16 x": lambda x16=x16: dequant_gemm(x16),
                "dispatch, bf16 x": lambda x16=x16: layer(x16),
            }, repeats)
            ref = x32 @ w32.T
            err = float((cpu_int4_matmul(x32, packed) - ref).norm() / ref.norm())
            chosen = layer.kernel_backend(x16)
        rows.append({"M": m, "K": 4096, "N": 4096, "group": 128, "timings": t, "int4_rel_err": err,
                     "dispatch_backend": chosen,
                     "speedup_vs_fp32": t["fp32 matmul"]["median_ms"] / t["int4 op, fp32 x"]["median_ms"],
                     "speedup_vs_bf16": t["bf16 matmul"]["median_ms"] / t["int4 op, bf16 x"]["median_ms"],
                     "dispatch_vs_bf16": t["bf16 matmul"]["median_ms"] / t["dispatch, bf16 x"]["median_ms"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def ensure_checkpoint(group: int, runs_dir: Path) -> Path:
    out = runs_dir / f"smollm2-135m-instruct-rtn-w4g{group}"
    if not (out / "config.json").is_file():
        from qcal.cli import main as qcal_main

        cmd = ["quantize", "--method", "rtn", "--group-size", str(group), "-o", str(out)]
        print("qcal " + " ".join(cmd), flush=True)
        if qcal_main(cmd) != 0:
            raise SystemExit(f"`qcal {' '.join(cmd)}` failed")
    return out


def e2e_decode(args: argparse.Namespace) -> dict:
    from qcal.model.loading import load_model

    groups = [int(g) for g in args.groups.split(",") if g]
    ckpts = {g: ensure_checkpoint(g, args.runs_dir) for g in groups}
    variants: list[tuple[str, Any, str | None, str]] = [
        ("float32", None, None, "float32"), ("bfloat16", None, None, "bfloat16")]
    for g, path in ckpts.items():
        variants += [(f"int4 g{g}, bf16 model (auto: int4 op)", path, None, "bfloat16"),
                     (f"int4 g{g}, fp32 model, QCAL_KERNEL=cpu (int4 op)", path, "cpu", "float32"),
                     (f"int4 g{g}, fp32 model (auto: reference)", path, None, "float32")]
    text = None
    with contextlib.suppress(Exception):
        from qcal.data import eval_text

        text = eval_text("en")
    rows, float_tokens = [], None
    for label, path, backend, dtype in variants:
        with kernel_env(backend):
            model, tok, _ = load_model(path, dtype=dtype)
            ids = tok(PROMPT, return_tensors="pt")["input_ids"]
            probe = torch.zeros(1, 1, dtype=getattr(torch, dtype))
            backends = Counter(m.kernel_backend(probe) for m in model.modules()
                               if isinstance(m, QuantLinear))
            greedy_decode(model, ids, 4)  # warm-up: repacks, allocator
            rates, gen = [], None
            for _ in range(args.repeats):
                gen, seconds = greedy_decode(model, ids, args.decode_tokens)
                rates.append(args.decode_tokens / seconds)
            if float_tokens is None:
                float_tokens = gen
            same = (gen == float_tokens)[0].tolist()
            prefix = same.index(False) if False in same else len(same)
            row = {"model": label, "checkpoint": str(path) if path else "default model",
                   "tokens_per_s": statistics.median(rates), "tokens_per_s_min": min(rates),
                   "tokens_per_s_max": max(rates), "backends": dict(backends),
                   "weight_MB": weight_bytes(model) / 2**20,
                   "kernel_cache_MB": kernel_cache_bytes(model) / 2**20,
                   "greedy_prefix_equal_to_float32": prefix}
            if text is not None and args.ppl_windows > 0:
                from qcal.eval.perplexity import perplexity

                res = perplexity(model, tok, text, 512, None, 2, args.ppl_windows, progress=False)
                row["ppl_en"] = res.ppl
            rows.append(row)
            print(json.dumps(row), flush=True)
            del model
    return {"decode_tokens": args.decode_tokens, "prompt_tokens": int(ids.shape[1]),
            "ppl_text": (f"debian-handbook en eval split, first {args.ppl_windows} windows"
                         if text else None),
            "checkpoints": {str(g): str(p) for g, p in ckpts.items()}, "rows": rows}


def cpu_part(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    load_before = load_average()
    section: dict[str, Any] = {"matmul": cpu_matmuls(args.repeats)}
    if not args.skip_e2e:
        section["decode"] = e2e_decode(args)
    elif (args.merge or args.out.with_suffix(".json")).is_file():
        # Keep the earlier decode table, with the provenance of the run that measured it.
        old = json.loads((args.merge or args.out.with_suffix(".json")).read_text()).get("cpu", {})
        if old.get("decode"):
            section["decode"] = old["decode"]
            section["decode_provenance"] = old.get("decode_provenance", old.get("provenance"))
    load_after = load_average()
    section["provenance"] = provenance(
        model="models/smollm2-135m-instruct (SmolLM2-135M-Instruct, float32, itself dequantized from Q4_1)",
        data="random weights/activations for the matmuls; PROMPT in scripts/bench_kernels.py for decode",
        torch_threads=torch.get_num_threads(),
        load_average=f"{load_before[0]:.2f} at start, {load_after[0]:.2f} at end "
                     f"({os.cpu_count()} cores; other engineers' jobs share this machine)",
        timing=f"median of {args.repeats} samples, interleaved round-robin across variants; "
               f"{args.threads} torch thread(s) (--threads): on a machine shared with other jobs, "
               "multi-thread barriers stall whenever a core is taken",
    )
    return section


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    merge = args.merge or args.out.with_suffix(".json")
    data: dict[str, Any] = {}
    if merge.is_file():
        data = json.loads(merge.read_text())
    do_gpu = args.part == "gpu" or (args.part == "auto" and torch.cuda.is_available())
    if args.part in ("auto", "cpu"):
        data["cpu"] = cpu_part(args)
        write_results(args.out, data, render(data))
    if do_gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--part gpu needs a CUDA device")
        from bench_kernels_gpu import gpu_part  # beside this script

        for section in gpu_part(args.repeats):  # yields the growing section after each shape
            data["gpu"] = section
            write_results(args.out, data, render(data))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
