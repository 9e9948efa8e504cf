"""The peer benchmark's tables (scripts/bench_peers.py): qcal vs GPTQModel and AutoAWQ
(results/peers.md) and qcal GPTQ vs GPTQModel through three loaders
(results/gptq_vs_peer.md). The benchmark writes each table's JSON with every measured step;
these render the Markdown from it, also again later:

    qcal report --study peers          [--out results/peers]
    qcal report --study gptq-vs-peer   [--out results/gptq_vs_peer]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qcal.results import markdown_table, provenance_markdown


def _row(name: str, what: str, run: dict[str, Any] | None, ppl: dict[str, Any] | None,
         n_layers: int) -> list[Any]:
    if not run:
        return [name, what, "not run", "", "", "", "", ""]
    if run["returncode"] != 0:
        return [name, what, "failed: " + run.get("error_tail", "").strip().splitlines()[-1][:120],
                "", "", "", "", ""]
    layers = run.get("layer_seconds")
    per_layer = (sum(layers) / len(layers)) if layers else (
        run["quantize_seconds"] / n_layers if run.get("quantize_seconds") else None)
    return [name, what, run["wall_seconds"], run.get("quantize_seconds") or "-",
            round(per_layer, 1) if per_layer else "-", run["max_rss_mib"],
            round(ppl["ppl"], 3) if ppl else "-",
            f"{run['load_before'][0]} / {run['load_after'][0]}"]


def render_speed(data: dict[str, Any]) -> str:
    """results/peers.md from its JSON (bench_peers.py's default run)."""
    st, s, n = data["state"], data["setting"], data["n_layers"]
    head = ["quantizer", "settings", "process wall s", "quantize s", "s / layer", "peak RSS MiB",
            "ppl (en)", "load 1-min before / after"]
    rows = [
        _row("qcal GPTQ", f"w4 g{s['gptq_group']} sym, damp 0.01", st.get("qcal-gptq"),
             st.get("ppl/qcal-gptq"), n),
        _row("GPTQModel", "same", st.get("gptqmodel"), st.get("ppl/gptqmodel"), n),
        _row("qcal AWQ", f"w4 g{s['awq_group']} asym, qcal's defaults", st.get("qcal-awq"),
             st.get("ppl/qcal-awq"), n),
        _row(f"qcal AWQ @ {s['baseline_rev']}", "same flags, code before the speed work",
             st.get("qcal-awq-baseline"), st.get("ppl/qcal-awq-baseline"), n),
        _row("AutoAWQ", "same, no duo scaling" + (
            f"; first {s['autoawq_layers']} layers only" if s["autoawq_layers"] else ""),
             st.get("autoawq"), st.get("ppl/autoawq"), n),
    ]
    md = ["# qcal vs GPTQModel and AutoAWQ on the same calibration ids", "",
          f"Float model perplexity on the same windows: {st['ppl/float']['ppl']:.3f}"
          if st.get("ppl/float") else "", "",
          markdown_table(head, rows), "", *_ratios(st, s, n), _rss_line(st, data["model_file_mib"]),
          "",
          "quantize s: the quantize step as each tool logs it (qcal: quant_log.json; peers: the "
          "worker's timer around `quantize()`), without start-up, model load and save; process "
          "wall s includes them. s / layer for AutoAWQ: from the start of one layer's search to "
          "the next; qcal's is its quantize s over the layer count. Peak RSS: the largest "
          "resident set of the process (GNU time).", "",
          "## Provenance", "", provenance_markdown(data["provenance"])]
    return "\n".join(md)


def _rss_line(st: dict[str, Any], file_mib: float) -> str:
    qcal = {k: (st.get(k) or {}).get("max_rss_mib") for k in ("qcal-gptq", "qcal-awq")}
    parts = [f"{k} {v:.0f} MiB = {v / file_mib:.2f}x" for k, v in qcal.items() if v]
    return (f"- peak RSS against the float model file ({file_mib:.0f} MiB; target < 2x): "
            + ", ".join(parts)) if parts else ""


def _ratios(st: dict[str, Any], s: dict[str, Any], n_layers: int) -> list[str]:
    def q(key: str) -> float | None:
        run = st.get(key) or {}
        return run.get("quantize_seconds") if run.get("returncode") == 0 else None

    lines = []
    if q("qcal-gptq") and q("gptqmodel"):
        lines.append(f"- GPTQ quantize step: qcal / GPTQModel = {q('qcal-gptq') / q('gptqmodel'):.2f} "
                     "(target <= 0.75)")
    if q("qcal-awq") and q("qcal-awq-baseline"):
        lines.append(f"- AWQ: today's qcal is {q('qcal-awq-baseline') / q('qcal-awq'):.2f}x "
                     f"faster than qcal at {s['baseline_rev']} (target >= 3)")
    aa = st.get("autoawq") or {}
    if q("qcal-awq") and aa.get("layer_seconds"):
        per = sum(aa["layer_seconds"]) / len(aa["layer_seconds"])
        mine = q("qcal-awq") / n_layers
        lines.append(f"- AWQ per layer: AutoAWQ {per:.1f} s vs qcal {mine:.1f} s "
                     f"(qcal {per / mine:.1f}x faster)" + (
                         f"; AutoAWQ timed on its first {len(aa['layer_seconds'])} layers only"
                         if not aa.get("finished") else ""))
    seeds = s.get("awq_seeds") or []
    means = {}
    for v in ("qcal-awq", "qcal-awq-baseline"):
        ppls = [(st.get(f"ppl/{v}") or {}).get("ppl")] + [
            (st.get(f"ppl/{v}/s{seed}") or {}).get("ppl") for seed in seeds]
        if all(ppls):
            means[v] = sum(ppls) / len(ppls)
            lines.append(f"- {v} perplexity over {len(ppls)} calibration seeds: "
                         + ", ".join(f"{x:.3f}" for x in ppls) + f" (mean {means[v]:.3f})")
    if len(means) == 2:
        lines.append(f"- AWQ mean perplexity, today's vs {s['baseline_rev']}: "
                     f"{100 * (means['qcal-awq'] / means['qcal-awq-baseline'] - 1):+.2f}% "
                     "(target within 1%)")
    for a, b in (("qcal-gptq", "gptqmodel"), ("qcal-awq", "qcal-awq-baseline"),
                 ("qcal-awq", "autoawq")):
        pa, pb = st.get(f"ppl/{a}"), st.get(f"ppl/{b}")
        if pa and pb:
            lines.append(f"- perplexity {a} vs {b}: {100 * (pa['ppl'] / pb['ppl'] - 1):+.2f}%")
    return lines



def _cell(res: dict[str, Any] | None) -> str:
    if res is None:
        return "not run"
    if "error" in res:
        return "fails: " + res["error"].strip().splitlines()[-1][:160]
    if res.get("backend", "auto") != "auto":
        return f"{res['ppl']:.3f} ({res['backend']}, {res['dtype'].replace('torch.', '')})"
    return f"{res['ppl']:.3f}"


def _fallback_notes(data: dict[str, Any]) -> list[str]:
    notes = sorted({r[loader]["auto_error"] for r in data["rows"].values()
                    for loader in ("gptqmodel_loader", "transformers_loader")
                    if r.get(loader) and r[loader].get("auto_error")})
    if not notes:
        return []
    return ["The automatic kernel choice of the peer loaders failed on these checkpoints, so "
            "they were re-scored with GPTQModel's pure-torch kernel, which takes only "
            "bfloat16/float16 (hence bf16 in the table; qcal's loader stays in float32). "
            "The failure: " + "; ".join(f"`{n}`" for n in notes) + ". GPTQModel's CPU int4 "
            "kernel accepts the layer (its validation allows any in_features) but torch's "
            "int4 op needs in_features (576) divisible by the group size (128): a ragged last "
            "group, which the GPTQ layout itself allows through g_idx. Group size 64 or 32 "
            "divides 576 and avoids it.", ""]


def _gap_note(data: dict[str, Any]) -> list[str]:
    """Where the two checkpoints land relative to float, scored by the same (qcal) loader."""
    fp = data["fp_ppl"]
    ppl = {name: (r["qcal_loader"] or {}).get("ppl") for name, r in data["rows"].items()}
    if not all(isinstance(ppl.get(k), float) for k in ("qcal", "gptqmodel")):
        return []
    q, g = ppl["qcal"], ppl["gptqmodel"]
    return ["", f"Scored by the same loader, qcal's checkpoint is {100 * (q / g - 1):+.1f}% in "
            f"perplexity against GPTQModel's ({q:.3f} vs {g:.3f}; float {fp:.3f}, so the gaps to "
            f"float are {q - fp:.2f} and {g - fp:.2f}). Per-layer losses in the two quant logs "
            "use different normalisations and are taken on each quantizer's own (already "
            "quantized) layer inputs, so they do not explain the difference by themselves."]


def render_loaders(data: dict[str, Any]) -> str:
    """results/gptq_vs_peer.md from its JSON (bench_peers.py --loaders)."""
    rows = []
    for name, r in data["rows"].items():
        run = r["run"]
        rows.append([name, "ok" if run["returncode"] == 0 else "failed", run["wall_seconds"],
                     run.get("quantize_seconds", ""), run["max_rss_mib"],
                     _cell(r["qcal_loader"]), _cell(r["gptqmodel_loader"]),
                     _cell(r["transformers_loader"])])
    md = ["# qcal GPTQ vs GPTQModel (w4 g128, " + ("sym" if data["sym"] else "asym")
          + (", act-order" if data.get("desc_act") else ", no act-order") + ", damp 0.01)", "",
          f"Float model perplexity on the same windows: {data['fp_ppl']:.3f}", "",
          markdown_table(["quantizer", "run", "process wall s", "quantize s", "max RSS MiB",
                          "ppl, qcal loader", "ppl, GPTQModel loader",
                          "ppl, transformers loader"], rows), "",
          "Loaders compute in float32 unless marked; GPTQModel and transformers (+ optimum) ran "
          "in the peer virtualenv with GPTQModel's CPU kernels.", "", *_fallback_notes(data),
          "Process wall time includes Python start-up, model load, calibration and save; "
          "both ran back to back on the same shared 2-core machine. qcal's CLI rebuilt the "
          "calibration set from the same source and seed; digest identical to the ids given "
          f"to GPTQModel: {data['rows']['qcal']['run'].get('same_calibration_digest')}."]
    md += _gap_note(data)
    md += ["", "## Provenance", "", provenance_markdown(data["provenance"])]
    return "\n".join(md)



def rerender_json(name: str, grids: list[Path], out: Path | None,
              render: Any) -> None:
    from qcal.errors import ConfigError
    from qcal.fsio import atomic_write_text
    from qcal.paths import results_dir

    if grids:
        raise ConfigError(f"--study {name} reads no grid: it re-renders the JSON that "
                          "scripts/bench_peers.py wrote (--out names it)")
    out = out or results_dir() / name.replace("-", "_")
    source = out.with_suffix(".json")
    if not source.is_file():
        raise ConfigError(f"{source} does not exist; run scripts/bench_peers.py first")
    atomic_write_text(out.with_suffix(".md"), render(json.loads(source.read_text())).rstrip() + "\n")
    print(f"wrote {out}.md")


def render_speed_study(grids: list[Path], out: Path | None = None) -> None:
    rerender_json("peers", grids, out, render_speed)


def render_loaders_study(grids: list[Path], out: Path | None = None) -> None:
    rerender_json("gptq-vs-peer", grids, out, render_loaders)
