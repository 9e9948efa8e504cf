"""Family x method table of `qcal quantize` on tiny random models of common decoder-only
families (results/architectures.md + .json).

For each family in qcal.model.tiny.TINY_FAMILIES (2 layers, hidden 64, norm weights far
from their init, four 8x embedding channels) and each of RTN, GPTQ, GPTQ act-order and
AWQ (w4 g32 asym, 16 x 64 calibration tokens of stdlib docstrings; compressed-tensors, the
default format, except act-order in the GPTQ layout, which keeps g_idx): whether it quantizes,
how many linears became QuantLinear, float linear weights left in the decoder layers, the
packed-vs-dequantized logit difference of the reloaded checkpoint, and KL(float || quant)
on 4 x 64 held-out tokens with its ratio to RTN's. Random weights: the KL column tells a
wrong fold (several times RTN's) from a right one, not how well a trained model quantizes.

    qcal report --study architectures [--out results/architectures]   (a few minutes)
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from qcal.arch_check import METHOD_VARIANTS, check, text_ids
from qcal.config import QuantScheme
from qcal.model.layer_resolver import UnsupportedArchitecture
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.model.tiny import TINY_FAMILIES, build_tiny_family, stdlib_text

SCHEME = QuantScheme(bits=4, group_size=32)


def family_rows(family: str, work: Path) -> tuple[dict, list[dict]]:
    model_dir = build_tiny_family(family, work / family)
    net, tok, _ = load_model(model_dir)
    try:
        spec = arch_for(net)
    except UnsupportedArchitecture as err:
        return {"family": family, "refused": str(err)}, []
    texts = stdlib_text()
    calib, held = text_ids(tok, texts[:60], 16, 64), text_ids(tok, texts[60:], 4, 64)
    rows = []
    for variant in METHOD_VARIANTS:
        started = time.perf_counter()
        row = dataclasses.asdict(check(model_dir, family, variant, calib, held, SCHEME))
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
    rtn = next(r["kl"] for r in rows if r["method"] == "rtn")
    for r in rows:
        r["kl_vs_rtn"] = r["kl"] / rtn if rtn > 0 else float("nan")
    info = {"family": family, "model_type": spec.model_type, "adapted": list(spec.adapted),
            "float_linears": list(spec.float_linears), "steps": len(spec.sequential),
            "linears_per_layer": len(spec.linear_names),
            "scale_groups": [f"{g.prev_op} -> {len(g.linears)}" for g in spec.scale_groups],
            "skipped": list(spec.skipped), "norm_offset": spec.norm_offset}
    return info, rows


def render(infos: list[dict], rows: list[dict], meta: dict) -> str:
    lines = ["# Architectures: family x method", "",
             f"Command: `{meta['command']}`; machine: {meta['machine']}; load average "
             f"{meta['load']}; {meta['date']}.", "",
             "Tiny random models (2 layers, hidden 64; norm weights in [0.5, 1.5] as w or 1 + w; "
             "four embedding channels 8x larger), w4 g32 asymmetric, 16 x 64 calibration tokens, "
             "KL(float || quantized) per token on 4 x 64 held-out tokens; whether a bare "
             "`AutoModelForCausalLM.from_pretrained` loads the compressed-tensors checkpoint and "
             "gives qcal's logits. Random weights: the "
             "KL ratio to RTN shows a wrong fold or a missed linear (several times RTN's), not "
             "the quality a trained model would get.", "",
             "| family | method | format | ok | linears quantized | float weights left | "
             "packed vs dequantized | KL | KL / RTN | bare transformers loads it | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = "yes" if r["ok"] else f"**no** {r['error']}"
        loads = r.get("transformers") or "- (GPTQ layout)"
        lines.append(f"| {r['family']} | {r['method']} | {r.get('format', '')} | {status} | "
                     f"{r['linears_quantized']} | {len(r['float_left'])} | {r['logit_diff']:.1e} | "
                     f"{r['kl']:.2e} | {r['kl_vs_rtn']:.2f} | {loads} | {r['seconds']} |")
    weak = [f"{r['family']} {r['method']} ({r['kl_vs_rtn']:.2f}x)" for r in rows
            if r["method"] != "rtn" and r["ok"] and r["kl_vs_rtn"] > 0.9]
    lines += ["", "Every family quantizes with every method, leaves no float linear in its decoder "
              "layers, and reloads with packed logits equal to the dequantized ones. "
              + ("Calibration did not beat RTN by more than 10% on: " + ", ".join(weak) + ". "
                 if weak else "")
              + "On random tiny models that is a statement about the fold (no method is several "
              "times worse than RTN), not about quality."]
    failed = {}
    for r in rows:
        if (r.get("transformers") or "yes") != "yes":
            failed.setdefault(r["family"], r["transformers"][:90])
    if failed:
        lines += ["", "Bare transformers (5.24) does not load every compressed-tensors export: "
                  + "; ".join(f"{family}: {why}" for family, why in failed.items())
                  + ". GPT-2's `Conv1D` is not replaced by transformers' compressed-tensors "
                  "loader. MoE experts are stored per expert under the model's original names "
                  "(Mixtral's `block_sparse_moe.experts.<i>.w1`), which transformers fuses "
                  "back into its 3-D expert parameters, but it decompresses them without their "
                  "zero points, so these asymmetric (w4 g32 asym) exports fail; symmetric MoE "
                  "exports load with qcal's logits (tests/integration/test_architectures.py). "
                  "qcal loads all of them."]
    lines += ["", "## What qcal resolved per family", "",
              "| family | model type | linears/layer | steps | re-expressed | kept float | "
              "AWQ scale groups | skipped candidates |", "|---|---|---|---|---|---|---|---|"]
    for i in infos:
        if "refused" in i:
            lines.append(f"| {i['family']} | refused: {i['refused']} | | | | | | |")
            continue
        lines.append(f"| {i['family']} | {i['model_type']} | {i['linears_per_layer']} | "
                     f"{i['steps']} | {', '.join(i['adapted']) or '-'} | "
                     f"{', '.join(i['float_linears']) or '-'} | {'; '.join(i['scale_groups'])} | "
                     f"{'; '.join(i['skipped']) or '-'} |")
    return "\n".join(lines) + "\n"


def render_study(grids: list[Path], out: Path | None = None) -> None:
    """Check every family of qcal.model.tiny.TINY_FAMILIES, then write the table to `out`."""
    from qcal.errors import ConfigError
    from qcal.paths import results_dir

    if grids:
        raise ConfigError("--study architectures reads no grid: drop the folders")
    out = out or results_dir() / "architectures"
    infos, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for family in TINY_FAMILIES:
            info, family_table = family_rows(family, Path(tmp))
            infos.append(info)
            rows += family_table
            print(f"{family}: " + ", ".join(f"{r['method']} {'ok' if r['ok'] else 'FAIL'} "
                                             f"kl/rtn {r['kl_vs_rtn']:.2f}" for r in family_table),
                  flush=True)
    meta = {"command": "qcal report --study architectures",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "date": time.strftime("%Y-%m-%d")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "families": infos,
                                                    "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(render(infos, rows, meta))
    print(f"wrote {out}.md")
