"""GPTQ vs RTN vs float on the default model: perplexity, loss, time, and the CLI's peak memory.

One calibration set and one held-out text for every row. Each variant quantizes a
fresh copy of the model in this process (packed QuantLinear layers), then scores the
English evaluation text of the handbook. Finally `qcal quantize --method gptq` runs as
a subprocess under `/usr/bin/time -v` for its wall time and peak RSS, and the
checkpoint it wrote is loaded back and scored too (save -> load on the real model).

    python scripts/bench_gptq.py --nsamples 128 --seqlen 512
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from qcal.calib import resolve_calib
from qcal.cli import command_prefix
from qcal.config import GPTQConfig, QuantScheme, RTNConfig
from qcal.data import eval_text
from qcal.eval.perplexity import perplexity_of_ids, tokenize_text
from qcal.methods import METHODS, RunOptions
from qcal.model.loading import load_model, resolve_model_dir
from qcal.paths import results_dir
from qcal.results import (
    markdown_table,
    provenance,
    provenance_markdown,
    timed_command,
    write_results,
)

VARIANTS: dict[str, tuple[str, Any]] = {
    "rtn-asym": ("rtn", RTNConfig(QuantScheme(4, 128, sym=False))),
    "rtn-sym": ("rtn", RTNConfig(QuantScheme(4, 128, sym=True))),
    "gptq-asym": ("gptq", GPTQConfig(QuantScheme(4, 128, sym=False))),
    "gptq-sym": ("gptq", GPTQConfig(QuantScheme(4, 128, sym=True))),
    "gptq-asym-act": ("gptq", GPTQConfig(QuantScheme(4, 128, sym=False), desc_act=True)),
    "gptq-sym-act": ("gptq", GPTQConfig(QuantScheme(4, 128, sym=True), desc_act=True)),
}


def score(net: torch.nn.Module, ids: torch.Tensor, args: argparse.Namespace, desc: str) -> dict:
    res = perplexity_of_ids(net, ids, args.eval_seqlen, None, args.eval_batch, args.max_windows,
                            progress=True, desc=desc)
    return res.summary()


def time_cli(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    prefix = command_prefix()
    cmd = [*prefix, "quantize", "--method", "gptq", "--bits", "4",
           "--group-size", "128", "--calib", args.calib, "--nsamples", str(args.nsamples),
           "--seqlen", str(args.seqlen), "--seed", str(args.seed), "-o", str(out)]
    print("$", shlex.join(cmd), flush=True)
    run = timed_command(cmd)
    if run["returncode"] != 0:
        raise SystemExit(f"qcal quantize failed:\n{run['error_tail']}")
    return {"command": shlex.join(["qcal", *cmd[len(prefix):-2], "-o", "<dir>"]),
            "max_rss_mib": run["max_rss_mib"], "wall_seconds": run["wall_seconds"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calib", default="debian-handbook")
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-seqlen", type=int, default=512)
    p.add_argument("--eval-batch", type=int, default=4)
    p.add_argument("--max-windows", type=int, default=None, help="cap on evaluation windows")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--skip-cli", action="store_true", help="skip the timed CLI run")
    p.add_argument("--out", type=Path, default=results_dir() / "gptq")
    p.add_argument("--render-only", action="store_true",
                   help="rewrite <out>.md from <out>.json (no new measurement)")
    args = p.parse_args()
    if args.render_only:
        data = json.loads(args.out.with_suffix(".json").read_text())
        write_results(args.out, data, render(data["rows"], data["cli"], data["provenance"]))
        return 0
    torch.manual_seed(0)

    model_dir = resolve_model_dir(None)
    net, tok, _ = load_model(model_dir)
    calib = resolve_calib(args.calib, tok, nsamples=args.nsamples, seqlen=args.seqlen,
                          seed=args.seed)
    ids = tokenize_text(tok, eval_text("en"))
    rows: dict[str, dict[str, Any]] = {"fp": {"method": "float", **score(net, ids, args, "fp")}}
    del net
    for name in args.variants:
        method, cfg = VARIANTS[name]
        net, _, _ = load_model(model_dir)
        logs: list[str] = []
        started = time.perf_counter()
        losses = METHODS.get(method).run(
            net, cfg, calib.input_ids,
            RunOptions(progress=True, log=logs.append, weights_dir=model_dir))
        seconds = time.perf_counter() - started
        rows[name] = {"method": method, "sym": cfg.scheme.sym,
                      "desc_act": getattr(cfg, "desc_act", False),
                      "quantize_seconds": round(seconds, 1), **score(net, ids, args, name)}
        if method == "gptq":
            rows[name]["hessian_loss_sum"] = sum(v for v in losses.values() if v is not None)
        print(name, rows[name], flush=True)
        del net
        gc.collect()

    cli: dict[str, Any] | None = None
    if not args.skip_cli:
        tmp = Path(tempfile.mkdtemp(prefix="bench-gptq-"))
        try:
            cli = time_cli(args, tmp / "ckpt")
            net, _, _ = load_model(tmp / "ckpt")
            cli["loaded_checkpoint"] = score(net, ids, args, "cli-ckpt")
            del net
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        cli["float_file_mib"] = round((model_dir / "model.safetensors").stat().st_size / 2**20, 1)

    fp = rows["fp"]["ppl"]
    for sym in ("asym", "sym"):
        rtn = rows.get(f"rtn-{sym}", {}).get("ppl")
        for name in (f"gptq-{sym}", f"gptq-{sym}-act"):
            if rtn is not None and name in rows:
                rows[name]["gap_recovered"] = (rtn - rows[name]["ppl"]) / (rtn - fp)
    prov = provenance(
        model=str(model_dir), calibration=calib.manifest.get("digest", calib.manifest),
        calib_setup=f"{args.calib}, selector random, {args.nsamples} x {args.seqlen} tokens, "
                    f"seed {args.seed}",
        evaluation=f"qcal.data.eval_text('en') (held-out handbook chapters), fixed windows of "
                   f"{args.eval_seqlen}, cap {args.max_windows or 'none'}",
    )
    data = {"provenance": prov, "rows": rows, "cli": cli,
            "calib_manifest": calib.manifest}
    write_results(args.out, data, render(rows, cli, prov))
    print(f"wrote {args.out}.json/.md")
    return 0


def render(rows: dict[str, dict[str, Any]], cli: dict[str, Any] | None,
           prov: dict[str, Any]) -> str:
    table = [[name, r["method"], r.get("sym", ""), r.get("desc_act", ""), r["ppl"],
              r.get("gap_recovered", ""), r.get("quantize_seconds", "")]
             for name, r in rows.items()]
    md = ["# GPTQ vs RTN (w4, group 128) on the default model", "",
          markdown_table(["variant", "method", "sym", "act-order", "ppl (en)",
                          "RTN->fp gap recovered", "quantize s"], table), "",
          "gap recovered = (ppl_RTN - ppl_GPTQ) / (ppl_RTN - ppl_fp), same symmetry."]
    better = [n for n, r in rows.items() if n.startswith("gptq") and
              r["ppl"] < rows.get("rtn-" + ("sym" if r["sym"] else "asym"), {}).get("ppl", -1)]
    met = [n for n, r in rows.items() if r.get("gap_recovered", 0) >= 0.4]
    md += ["", f"Better than RTN of the same symmetry: {', '.join(better) or 'none'}. "
           f"At least 40% of the gap recovered: {', '.join(met) or 'none'}."]
    if cli:
        md += ["", "## The CLI run (`/usr/bin/time -v`)", "",
               f"- Command: `{cli['command']}`",
               f"- Wall time: {cli['wall_seconds']} s; max RSS: {cli['max_rss_mib']:.0f} MiB "
               f"(float model file {cli['float_file_mib']} MiB; budget 2x = "
               f"{2 * cli['float_file_mib']:.0f} MiB)",
               f"- Its checkpoint, loaded back: ppl {cli['loaded_checkpoint']['ppl']:.3f}"]
    md += ["", "## Notes", "", *NOTES, "", "## Provenance", "", provenance_markdown(prov)]
    return "\n".join(md)


NOTES = [
    "- The float baseline is SmolLM2-135M-Instruct dequantized from a Q4_1 GGUF (4-bit grid, "
    "blocks of 32): every gap above is relative to that model, not to the original bf16 weights.",
    "- Act-order matters on this model: a few hidden channels carry far larger activations "
    "than the rest (they dominate diag(H)), and visiting those columns first lets the "
    "remaining columns absorb their rounding error.",
    "- Peak memory: decoder layers are re-read from the model's safetensors one at a time "
    "(`RunOptions.weights_dir`, set by the pipeline for a freshly loaded float model), the "
    "layer's inputs are overwritten by its outputs, and glibc is told to return freed layers "
    "to the OS. What stays resident is Python + torch + transformers, the tokenizer and "
    "calibration pool, the float embedding (108 MiB, tied with the LM head), the calibration "
    "activations (128 x 512 x 576 float32 = 144 MiB), one float layer, the quantized layers "
    "and the save buffers at the end.",
    "- A side-by-side with GPTQModel on the same calibration ids is in results/gptq_vs_peer.md.",
]


if __name__ == "__main__":
    sys.exit(main())
