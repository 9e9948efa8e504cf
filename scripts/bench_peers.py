#!/usr/bin/env python
"""qcal vs its peers on the same calibration ids, in one run: GPTQ vs GPTQModel, AWQ vs
AutoAWQ, and today's AWQ vs the AWQ of an earlier qcal commit.

Every quantizer runs as a subprocess under `/usr/bin/time -v` (process wall, peak RSS),
one after the other on the same machine; the quantize step's own time comes from each
tool's log. Peers live in their own virtualenvs under runs/ (built here when missing,
pinned, never project dependencies): GPTQModel 7.6.0 (scripts/setup_peer_venv.sh) and
AutoAWQ 0.2.9 (with transformers 4.51.3, the last it supports). qcal's loader scores every
checkpoint on the same held-out windows (one scorer). Results: results/peers.{json,md}.
Each step's result is kept in qcal's step cache under runs/bench_peers, so an interrupted run
resumes.

    python scripts/bench_peers.py [--autoawq-layers 3 | --autoawq-full] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from qcal.cache import JsonSteps, StepCache
from qcal.calib import resolve_calib
from qcal.cli import command_prefix
from qcal.data import eval_text
from qcal.eval.perplexity import perplexity_of_ids, tokenize_text
from qcal.model.loading import load_model, resolve_model_dir
from qcal.paths import results_dir, runs_dir
from qcal.results import (
    markdown_table,
    provenance,
    provenance_markdown,
    timed_command,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent

# The last commit before the AWQ speed work (Gram loss for lone linears, token budget).
BASELINE_REV = "4112516"
AUTOAWQ_PINS = ["torch==2.13.0", "transformers==4.51.3", "autoawq==0.2.9"]


def ensure_autoawq(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not (python.exists() and subprocess.run([str(python), "-c", "import awq"], cwd="/",
                                               capture_output=True).returncode == 0):
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *AUTOAWQ_PINS], check=True)
    return python


def ensure_gptqmodel(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "setup_peer_venv.sh")], check=True,
                       env={**os.environ, "PEER_VENV": str(venv)})
    return python


def baseline_source(rev: str, dest: Path) -> Path:
    """qcal's package as it was at `rev` (git archive), unpacked under `dest`."""
    if not (dest / "qcal" / "__init__.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "qcal"],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def peer_version(python: Path, probe: str) -> str:
    # cwd="/": `-c` puts the working directory on sys.path, and a checkout's kernels/ folder
    # would shadow the `kernels` package the peers' transformers imports.
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    # Peers print banners on import; the probe's own line is the last one.
    lines = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()
    return lines[-1][:300] if lines else f"probe exited {out.returncode}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nsamples", type=int, default=32)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--calib", default="debian-handbook")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gptq-group", type=int, default=128)
    p.add_argument("--awq-group", type=int, default=64,
                   help="64: AutoAWQ needs the group size to divide every in_features (576)")
    p.add_argument("--baseline-rev", default=BASELINE_REV)
    p.add_argument("--awq-seeds", type=int, nargs="*", default=[1],
                   help="further calibration seeds for both qcal AWQ runs (quality, not speed)")
    p.add_argument("--autoawq-layers", type=int, default=3,
                   help="time AutoAWQ's first N layers only (0: the whole model, --autoawq-full)")
    p.add_argument("--autoawq-full", action="store_true")
    p.add_argument("--only", nargs="*", default=None,
                   help="steps to run (qcal-gptq gptqmodel qcal-awq qcal-awq-baseline autoawq)")
    p.add_argument("--fresh", action="store_true", help="discard cached steps and start over")
    p.add_argument("--out", type=Path, default=results_dir() / "peers")
    args = p.parse_args()
    layers = 0 if args.autoawq_full else args.autoawq_layers

    work = runs_dir() / "bench_peers"
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_dir(None)
    _, tok, _ = load_model(model_dir)
    calib = resolve_calib(args.calib, tok, nsamples=args.nsamples, seqlen=args.seqlen,
                          seed=args.seed)
    ids = tokenize_text(tok, eval_text("en"))
    n_windows = ids.numel() // 512
    windows = ids[: n_windows * 512].view(n_windows, 512)
    setting = {"calib": calib.manifest.get("digest"), "gptq_group": args.gptq_group,
               "awq_group": args.awq_group, "baseline_rev": args.baseline_rev,
               "autoawq_layers": layers, "windows": n_windows, "awq_seeds": args.awq_seeds}
    steps = JsonSteps(StepCache(work), "steps", setting)
    if steps.other_settings():
        raise SystemExit(f"{work} holds a run with other settings; pass --fresh")

    def failed(saved: Any) -> bool:
        return isinstance(saved, dict) and saved.get("returncode", 0) != 0

    def step(key: str, fn: Any) -> Any:
        if args.only is not None and key.split("/")[0] not in args.only:
            return steps.get(key)

        def announced() -> Any:
            print(f"== {key}", flush=True)
            return fn()

        return steps.run(key, announced, failed)

    save_file({"ids": calib.input_ids.contiguous()}, str(work / "calib.safetensors"))

    def qcal_run(name: str, method_args: list[str], pythonpath: Path | None = None,
                 seed: int = args.seed) -> dict[str, Any]:
        out = work / name
        common = ["--calib", args.calib, "--nsamples", str(args.nsamples), "--seqlen",
                  str(args.seqlen), "--seed", str(seed), "--device", "cpu", "--overwrite"]
        cmd = [*command_prefix(), "quantize", *method_args, *common, "-o", str(out)]
        env, cwd = None, ROOT
        if pythonpath is not None:
            # An earlier commit's package in the same venv: `-m` puts the working directory
            # first on sys.path, so run from the unpacked source; QCAL_HOME finds the models.
            cmd = [sys.executable, "-m", "qcal", *cmd[len(command_prefix()):]]
            env, cwd = {"QCAL_HOME": str(ROOT)}, pythonpath
        print("$", " ".join(cmd), flush=True)
        run = timed_command(cmd, env=env, cwd=cwd)
        where = subprocess.run([sys.executable, "-c", "import qcal; print(qcal.__file__)"],
                               capture_output=True, text=True, cwd=cwd,
                               env={**os.environ, **(env or {})})
        run["qcal_package"] = where.stdout.strip()  # proves which code ran
        if run["returncode"] == 0:
            log = json.loads((out / "quant_log.json").read_text())
            run["quantize_seconds"] = log["quantize_seconds"]
            digest = (log.get("calibration") or {}).get("digest")
            run["calibration_digest"] = digest
            run["same_calibration"] = digest == setting["calib"] if seed == args.seed else None
        else:
            print(run["error_tail"], file=sys.stderr)
        return run

    def peer_run(python: Path, cmd: list[str], result: Path, env: dict[str, str] | None = None
                 ) -> dict[str, Any]:
        print("$", " ".join(cmd), flush=True)
        run = timed_command([str(python), *cmd], env=env, cwd=ROOT)
        if run["returncode"] == 0:
            run.update(json.loads(result.read_text()))
        else:
            print(run["error_tail"], file=sys.stderr)
        return run

    gptq_args = ["--method", "gptq", "--bits", "4", "--group-size", str(args.gptq_group),
                 "--allow-ragged-groups", "--sym", "--damp", "0.01"]
    awq_args = ["--method", "awq", "--bits", "4", "--group-size", str(args.awq_group)]
    step("qcal-gptq", lambda: qcal_run("qcal-gptq", gptq_args))
    gm_python = ensure_gptqmodel(runs_dir() / "peer-venv") if (
        args.only is None or "gptqmodel" in args.only) else None
    step("gptqmodel", lambda: peer_run(
        gm_python, [str(ROOT / "scripts" / "peer_gptqmodel_worker.py"), "quantize", str(model_dir),
                    str(work / "calib.safetensors"), str(work / "gptqmodel"),
                    str(work / "gptqmodel.json"), "--sym", "--group", str(args.gptq_group)],
        work / "gptqmodel.json", {"GPTQMODEL_CPU_WORKERS": "2"}))
    step("qcal-awq", lambda: qcal_run("qcal-awq", awq_args))
    step("qcal-awq-baseline", lambda: qcal_run(
        "qcal-awq-baseline", awq_args, baseline_source(args.baseline_rev, work / "baseline-src")))
    for seed in args.awq_seeds:  # more calibration draws: AWQ's quality, old vs new
        step(f"qcal-awq/s{seed}", lambda s=seed: qcal_run(f"qcal-awq-s{s}", awq_args, seed=s))
        step(f"qcal-awq-baseline/s{seed}", lambda s=seed: qcal_run(
            f"qcal-awq-baseline-s{s}", awq_args,
            baseline_source(args.baseline_rev, work / "baseline-src"), seed=s))
    aa_python = ensure_autoawq(runs_dir() / "awq-venv") if (
        args.only is None or "autoawq" in args.only) else None
    step("autoawq", lambda: peer_run(
        aa_python, [str(ROOT / "scripts" / "peer_autoawq_worker.py"), str(model_dir),
                    str(work / "calib.safetensors"), str(work / "autoawq"),
                    str(work / "autoawq.json"), "--group", str(args.awq_group),
                    "--max-layers", str(layers)], work / "autoawq.json"))

    def score(path: Path) -> dict[str, Any]:
        net, _, _ = load_model(path)
        res = perplexity_of_ids(net, windows.reshape(-1), 512, None, 4, None, progress=True,
                                desc=f"ppl[{path.name}]")
        return {"ppl": res.ppl, "tokens": res.tokens}

    step("ppl/float", lambda: score(model_dir))
    extra = [f"{v}/s{seed}" for seed in args.awq_seeds for v in ("qcal-awq", "qcal-awq-baseline")]
    for name in ("qcal-gptq", "gptqmodel", "qcal-awq", "qcal-awq-baseline", "autoawq", *extra):
        run = steps.get(name)
        if run and run["returncode"] == 0 and run.get("finished", True):
            step(f"ppl/{name}", lambda n=name: score(work / n.replace("/", "-")))
    file_mib = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    n_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    state = {"setting": setting, **steps.results}
    data = {"setting": setting, "state": state, "model_file_mib": round(file_mib, 1),
            "n_layers": n_layers,
            "provenance": provenance(
        model=str(model_dir), calibration=f"{args.calib}, random selector, {args.nsamples} x "
        f"{args.seqlen}, seed {args.seed} (digest {setting['calib'][:12]}); the same ids for "
        "every quantizer",
        evaluation=f"qcal's loader and scorer, all {n_windows} held-out English windows of 512",
        peers="; ".join([
            peer_version(gm_python, "import gptqmodel, transformers; print('GPTQModel', "
                         "gptqmodel.__version__, 'transformers', transformers.__version__)")
            if gm_python else "GPTQModel: not run now",
            peer_version(aa_python, "import awq, transformers; print('AutoAWQ', awq.__version__, "
                         "'transformers', transformers.__version__)")
            if aa_python else "AutoAWQ: not run now"]),
        peer_install="scripts/setup_peer_venv.sh (GPTQModel 7.6.0, torch 2.13.0 CPU); "
                     f"python -m venv runs/awq-venv && pip install {' '.join(AUTOAWQ_PINS)}")}
    write_results(args.out, data, render(data))
    print(f"wrote {args.out}.json/.md")
    return 0


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


def render(data: dict[str, Any]) -> str:
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


if __name__ == "__main__":
    sys.exit(main())
