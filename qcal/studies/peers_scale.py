"""qcal vs GPTQModel and llm-compressor on a real model of 1.5B parameters
(scripts/bench_peers.py --scale): GPTQ (act-order) and AWQ, each tool on the same
calibration ids and settings, one after the other in one run. With `--layers N` the
quantizers run on a copy of the model's first N layers (real weights;
qcal.studies.truncate), which times them per layer when whole runs do not fit a session;
perplexity is then not measured (it would not be the model's). Rows: quantize seconds,
s/layer, peak RSS, perplexity. Each step is cached, so a run resumes.

    qcal report --study peers-scale [--out results/peers_scale]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from qcal.paths import results_dir, runs_dir
from qcal.results import markdown_table, provenance_markdown
from qcal.studies.bench import Steps, provenance, write_results
from qcal.studies.peers import (
    GPTQMODEL_PROBE,
    LLMCOMPRESSOR_PINS,
    LLMCOMPRESSOR_PROBE,
    ensure_gptqmodel,
    ensure_llmcompressor,
    peer_run,
    peer_version,
    qcal_ppl,
    qcal_run,
)
from qcal.studies.peers_report import rerender_json
from qcal.studies.scale_report import cpu_hours
from qcal.studies.tables import shown
from qcal.studies.truncate import truncate_model

# (step, tool, method, what the row says about its settings)
ROWS = (("qcal-gptq", "qcal", "GPTQ", "w4 g128 sym, act-order, damp 0.01, float32"),
        ("gptqmodel-gptq", "GPTQModel", "GPTQ", "same (act_group_aware off)"),
        ("llmcompressor-gptq", "llm-compressor", "GPTQ",
         "same, act-order with static groups (actorder weight; 0.14 has no per-column groups)"),
        ("qcal-awq", "qcal", "AWQ", "w4 g128 asym, qcal's defaults"),
        ("gptqmodel-awq", "GPTQModel", "AWQ",
         "w4 g128 asym, gemm format, its defaults, bfloat16 (its CPU AWQ kernel takes no float32)"))


def _qcal_flags(step: str, model: Path, args: argparse.Namespace) -> list[str]:
    common = ["--model", str(model), "--calib", args.calib, "--nsamples", str(args.nsamples),
              "--seqlen", str(args.seqlen), "--seed", str(args.seed), "--device", "cpu",
              "--overwrite"]
    if step == "qcal-gptq":
        return ["--method", "gptq", "--bits", "4", "--group-size", "128", "--format", "gptq",
                "--sym", "--desc-act", "--damp", "0.01", *common]
    return ["--method", "awq", "--bits", "4", "--group-size", "128", *common]


def _peer_flags(step: str) -> list[str]:
    if step == "gptqmodel-gptq":
        return ["--sym", "--desc-act", "--group", "128"]
    # Its AWQ kernel on CPU (AwqTorchLinear) takes only float16/bfloat16: a float32 run
    # fails after its first layer (measured: 730 s for layer 0, then NotImplementedError).
    return ["--method", "awq", "--group", "128", "--dtype", "bfloat16"]


def scale_suite(args: argparse.Namespace, model_dir: Path, calib: Any, windows: Any,
                project: Path) -> None:
    digest = calib.manifest.get("digest")
    layers = args.layers or 0
    work = runs_dir() / f"bench_peers_scale-{model_dir.name}" / (f"L{layers}" if layers else "all")
    setting = {"model": model_dir.name, "layers": layers, "calib": digest,
               "windows": 0 if layers else windows.shape[0]}
    steps = Steps(work, setting, args.fresh, args.only)
    target = model_dir
    if layers:
        target = work / "model"
        if not (target / "TRUNCATED.json").is_file():
            truncate_model(model_dir, layers, target)
    save_file({"ids": calib.input_ids.contiguous()}, str(work / "calib.safetensors"))
    def wanted(prefix: str) -> bool:
        return args.only is None or any(s.startswith(prefix) for s in args.only)

    python = ensure_gptqmodel(args.peer_venv) if wanted("gptqmodel") else None
    llmc = ensure_llmcompressor(runs_dir() / "llmc-venv") if wanted("llmcompressor") else None
    for step, tool, _, _ in ROWS:
        out = work / step
        if tool == "qcal":
            steps.run(step, lambda s=step, o=out: qcal_run(o, _qcal_flags(s, target, args), digest))
        elif tool == "llm-compressor":
            steps.run(step, lambda s=step, o=out: peer_run(
                llmc, ["llmcompressor", str(target), str(work / "calib.safetensors"), str(o),
                       str(work / f"{s}.json"), "--desc-act", "--group", "128"],
                work / f"{s}.json"))
        else:
            steps.run(step, lambda s=step, o=out: peer_run(
                python, ["gptqmodel", str(target), str(work / "calib.safetensors"), str(o),
                         str(work / f"{s}.json"), *_peer_flags(s)],
                work / f"{s}.json", {"GPTQMODEL_CPU_WORKERS": "2"}))
    if not layers:
        steps.run("ppl/float", lambda: qcal_ppl(model_dir, windows))
        for step, *_ in ROWS:
            run = steps.get(step)
            if run and run["returncode"] == 0 and run.get("finished", True):
                steps.run(f"ppl/{step}", lambda s=step: qcal_ppl(work / s, windows, fail_soft=True))
    config = json.loads((model_dir / "config.json").read_text())
    # A peer that failed part-way still wrote how far it got (per-layer seconds).
    partial = {step: json.loads((work / f"{step}.json").read_text()) for step, tool, *_ in ROWS
               if tool != "qcal" and (work / f"{step}.json").is_file()
               and (steps.get(step) or {}).get("returncode") not in (0, None)}
    data = {"setting": setting, "state": steps.results, "partial": partial, "n_layers": layers or
            config["num_hidden_layers"], "model_layers": config["num_hidden_layers"],
            "provenance": provenance(
                model=shown(model_dir, project) + (f", first {layers} of "
                                                   f"{config['num_hidden_layers']} layers "
                                                   "(truncated copy, real weights)"
                                                   if layers else ""),
                calibration=f"{args.calib}, random selector, {args.nsamples} x {args.seqlen}, "
                            f"seed {args.seed} (digest {digest[:12]}); the same ids for every "
                            "quantizer",
                evaluation="none (a truncated model's perplexity is not the model's)" if layers
                else f"qcal's loader and scorer, {windows.shape[0]} held-out English windows of "
                     f"{windows.shape[1]}",
                peers="; ".join([peer_version(python, GPTQMODEL_PROBE, "GPTQModel"),
                                 peer_version(llmc, LLMCOMPRESSOR_PROBE, "llm-compressor")]),
                peer_install="scripts/setup_peer_venv.sh (GPTQModel 7.6.0, torch 2.13.0 CPU; "
                             "GPTQMODEL_CPU_WORKERS=2); python -m venv runs/llmc-venv && pip "
                             f"install {' '.join(LLMCOMPRESSOR_PINS)}")}
    out = args.out or results_dir() / ("peers_scale" + (f"_L{layers}" if layers else ""))
    write_results(out, data, render_scale(data))
    print(f"wrote {out}.json/.md")


def _row(step: str, tool: str, method: str, what: str, run: dict[str, Any] | None,
         ppl: dict[str, Any] | None, n_layers: int, partial: dict[str, Any] | None = None
         ) -> list[Any]:
    if not run:
        return [tool, method, what, "not run", "", "", "", "", ""]
    if run["returncode"] != 0:
        tail = run.get("error_tail", "").strip().split("Command exited with")[0].strip()
        done = (partial or {}).get("layer_seconds") or []
        got = (f" (after {len(done)} layer(s): {', '.join(f'{x:.0f}' for x in done)} s)"
               if done else "")
        per = round(sum(done) / len(done), 1) if done else ""
        return [tool, method, what, run.get("wall_seconds", ""),
                "failed: " + (tail.splitlines() or [""])[-1][:160] + got, per,
                round(run["max_rss_mib"] / 1024, 2) if run.get("max_rss_mib") else "", "", ""]
    layers = run.get("layer_seconds")
    per_layer = sum(layers) / len(layers) if layers else (
        run["quantize_seconds"] / n_layers if run.get("quantize_seconds") else None)
    return [tool, method, what, run["wall_seconds"], run.get("quantize_seconds") or "-",
            round(per_layer, 1) if per_layer else "-", round(run["max_rss_mib"] / 1024, 2),
            round(ppl["ppl"], 3) if ppl and ppl.get("ppl") else "-",
            f"{run['load_before'][0]} / {run['load_after'][0]}"]


def _ratio(st: dict[str, Any], mine: str, theirs: str) -> float | None:
    a, b = st.get(mine) or {}, st.get(theirs) or {}
    if a.get("returncode") == 0 and b.get("returncode") == 0 and b.get("quantize_seconds"):
        return a["quantize_seconds"] / b["quantize_seconds"]
    return None


def render_scale(data: dict[str, Any]) -> str:
    """results/peers_scale[_L<N>].md from its JSON."""
    st, n = data["state"], data["n_layers"]
    head = ["tool", "method", "settings", "process wall s", "quantize s", "s / layer",
            "peak RSS GiB", "ppl (en)", "load 1-min before / after"]
    rows = [_row(step, tool, method, what, st.get(step), st.get(f"ppl/{step}"), n,
                 (data.get("partial") or {}).get(step)) for step, tool, method, what in ROWS]
    scope = (f"the first {n} of its {data['model_layers']} layers (a truncated copy with the "
             "real weights: times and memory per layer are the real model's; no perplexity)"
             if data["setting"]["layers"] else f"all {n} layers")
    lines = []
    gptq, awq = _ratio(st, "qcal-gptq", "gptqmodel-gptq"), _ratio(st, "qcal-awq", "qcal-gptq")
    if gptq is not None:
        lines.append(f"- GPTQ quantize step, qcal / GPTQModel: {gptq:.2f} (goal <= 0.6: "
                     f"{'met' if gptq <= 0.6 else 'not met'})")
    if awq is not None:
        lines.append(f"- qcal AWQ / qcal GPTQ quantize time: {awq:.2f} (goal <= 1.5: "
                     f"{'met' if awq <= 1.5 else 'not met'})")
    llmc = _ratio(st, "qcal-gptq", "llmcompressor-gptq")
    if llmc is not None:
        lines.append(f"- GPTQ quantize step, qcal / llm-compressor: {llmc:.2f}")
    theirs = _ratio(st, "qcal-awq", "gptqmodel-awq")
    if theirs is not None:
        lines.append(f"- AWQ quantize step, qcal / GPTQModel: {theirs:.2f}")
    fp = (st.get("ppl/float") or {}).get("ppl")
    md = ["# qcal vs GPTQModel and llm-compressor at 1.5B parameters", "",
          f"Model: {data['provenance'].get('model')}; quantized over {scope}.", "",
          *([f"Float perplexity on the same windows: {fp:.3f}", ""] if fp else []),
          markdown_table(head, rows), "", *lines,
          f"- CPU time of the run: {cpu_hours(st):.2f} CPU hours (user + system).", "",
          "quantize s: the quantize step as each tool logs it (qcal: quant_log.json; GPTQModel: "
          "the worker's timer around `quantize()`), without start-up, model load and save; "
          "process wall s includes them. s / layer: GPTQModel's from its layer callback, "
          "qcal's its quantize s over the layers. Peak RSS: the largest resident set of the "
          "process (GNU time).", "", *data.get("notes", []),
          "## Provenance", "", provenance_markdown(data["provenance"])]
    return "\n".join(md)


def render_scale_study(grids: list[Path], out: Path | None = None) -> None:
    rerender_json("peers-scale", grids, out, render_scale)
