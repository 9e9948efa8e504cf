"""The int4 kernel benchmark's table (scripts/bench_kernels.py writes results/kernels.json,
its CPU part here and its GPU part on a lent GPU machine, each with its own provenance).

    qcal report --study kernels [--out results/kernels]   # the Markdown again from the JSON
"""

from __future__ import annotations

from pathlib import Path

from qcal.results import markdown_table, provenance_markdown, write_results


def render(data: dict) -> str:
    """results/kernels.md from its JSON (CPU and GPU sections)."""
    out = ["# int4 matmul kernels", "",
           "Written by `scripts/bench_kernels.py`; each section states the run that produced it.", ""]
    cpu = data.get("cpu")
    if cpu:
        out += ["## CPU per shape: torch's int4 op, dequantize-then-GEMM and dense matmul "
                "(K = N = 4096, group 128)", "",
                provenance_markdown(cpu["provenance"]), ""]
        rows = []
        for r in cpu["matmul"]:
            t = r["timings"]
            rows.append([r["M"], *(t[k]["median_ms"] for k in ("fp32 matmul", "bf16 matmul",
                                                                "int4 op, fp32 x", "int4 op, bf16 x")),
                         t.get("dequant+fp32 GEMM, bf16 x", {}).get("median_ms", "-"),
                         t.get("dispatch, bf16 x", {}).get("median_ms", "-"),
                         r.get("dispatch_backend", "-"),
                         r["speedup_vs_bf16"], r.get("dispatch_vs_bf16", "-"),
                         f"{r['int4_rel_err']:.1e}"])
        out += [markdown_table(["M", "fp32 ms", "bf16 ms", "int4 (fp32 x) ms", "int4 (bf16 x) ms",
                                "dequant+fp32 GEMM (bf16 x) ms", "dispatch (bf16 x) ms", "dispatch picks",
                                "bf16 / int4(bf16 x)", "bf16 / dispatch", "int4 rel. err"], rows), "",
                "Ratios > 1 mean the quantized path is faster than dense bf16 with a resident float "
                "weight. `dequant+fp32 GEMM` dequantizes the packed weight to float32 on every "
                "call and multiplies in float32 (what a model too big to keep float copies "
                "runs: `cache_dequantized = False`); "
                "`dispatch` is `QuantLinear(x)` with that setting: the int4 op up to "
                "`CPU_INT4_MAX_TOKENS` = 64 tokens and, without the cache, above too (a model "
                "that may cache its dequantized weights runs the float32 GEMM above 64 tokens: "
                "the `fp32` column). The int4 op "
                "computes in bf16 (x, scales and output rounded to bf16); `int4 rel. err` is its "
                "relative error against the exact float32 product of the same int4 weights. All "
                "timings of one row come from one interleaved run; compare ratios within a row.", ""]
        dec = cpu.get("decode")
        if dec:
            out += [f"## CPU: end-to-end greedy decode ({dec['decode_tokens']} tokens after a "
                    f"{dec['prompt_tokens']}-token prompt, batch 1, KV cache)", ""]
            if cpu.get("decode_provenance"):
                out += ["Measured by an earlier run (before the per-shape dispatch; this run "
                        "passed --skip-e2e):", "", provenance_markdown(cpu["decode_provenance"]), ""]
            rows = [[r["model"], r["tokens_per_s"],
                     f"{r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}",
                     r["weight_MB"], r["kernel_cache_MB"],
                     ", ".join(f"{k}: {v}" for k, v in r["backends"].items()) or "-",
                     r["greedy_prefix_equal_to_float32"], r.get("ppl_en", "-")] for r in dec["rows"]]
            out += [markdown_table(["model", "tokens/s (median)", "range", "weights MB", "kernel cache MB",
                                    "QuantLinear backends",
                                    "greedy tokens = float32", "ppl (en)"], rows, ".2f"), "",
                    f"Checkpoints: {dec['checkpoints']} (RTN, asymmetric, made by `qcal quantize --method "
                    "rtn`). Group 128 is ragged on the 576-wide inputs (last group 64): the op serves "
                    "it with blocks of 64 and repeated scales (kernels/cpu.py; see the backends "
                    "column). The lm_head (tied 49152 x 576 embedding) and the embedding stay float in "
                    "every variant. `weights MB`: parameters and buffers as loaded; `kernel cache MB`: "
                    "what the backends add (the int4 op's repack, or the reference's dequantized "
                    "float32 weights). `greedy tokens = float32`: leading generated tokens identical "
                    "to the float32 model's. `ppl (en)`: " + str(dec["ppl_text"]) + ", 512-token "
                    "windows, the same for every row; the gap between an int4 row on the op and the "
                    "same checkpoint on the exact reference is the cost of the op's bf16 arithmetic.", ""]
    out += render_gpu(data.get("gpu"))
    return "\n".join(out)



def render_gpu(gpu: dict | None) -> list[str]:
    head = "## GPU: Triton int4 kernels vs torch.matmul fp16 (group 128)"
    if not gpu:
        return [head, "", "Not measured yet: no CUDA device was present in the run that wrote this file. "
                "`scripts/gpu_check.sh` runs this part on a GPU machine.", ""]
    peak = f"{gpu['peak_GBps']:.0f} GB/s" if gpu.get("peak_GBps") else "n/a"
    out = [head, "", provenance_markdown(gpu["provenance"]), "",
           f"Device: {gpu['device']}; peak DRAM bandwidth {peak} ({gpu['peak_source']}); "
           f"measured device-to-device copy {gpu['copy_GBps']:.0f} GB/s.", ""]
    rows = [[r["M"], r["K"], r["fp16_ms"] * 1e3, r["int4_ms"] * 1e3, r["int4_actorder_ms"] * 1e3,
             r["speedup"], r["int4_GBps"], r["int4_frac_peak"], r["fp16_frac_peak"], r["int4_TFLOPs"],
             f"{r['max_rel_err']:.1e}", r["config"]] for r in gpu["rows"]]
    out += [markdown_table(["M", "K=N", "fp16 us", "int4 us", "int4 act-order us", "fp16 / int4",
                            "int4 GB/s", "int4 frac. of peak", "fp16 frac. of peak", "int4 TFLOP/s",
                            "rel. err", "autotuned config"], rows, ".2f"), "",
            "Bytes per product: int4 = K*N/2 + scales and zero points + x + y; fp16 = 2*K*N + x + y. "
            "`rel. err` is the worst of the contiguous and act-order kernels against the float32 "
            "reference on the same int4 weights.", ""]
    if gpu.get("errors"):
        out += ["Errors:", "", *[f"- {e}" for e in gpu["errors"]], ""]
    return out


def render_study(grids: list[Path], out: Path | None = None) -> None:
    from qcal.studies.bench import benchmark_json

    out, data = benchmark_json("kernels", "kernels", "scripts/bench_kernels.py", grids, out)
    write_results(out, data, render(data))
    print(f"wrote {out}.md")
