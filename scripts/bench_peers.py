#!/usr/bin/env python
"""qcal vs its peers on the same calibration ids, in one run. Two suites:

- speed (default; results/peers.{json,md}): GPTQ vs GPTQModel, AWQ vs AutoAWQ, and
  today's AWQ vs the AWQ of an earlier qcal commit; qcal's loader scores every checkpoint.
- --loaders (results/gptq_vs_peer[_act].{json,md}): qcal GPTQ vs GPTQModel with matched
  settings (w4 g128, damp 0.01, act-order with --desc-act), each checkpoint scored by qcal's,
  GPTQModel's and transformers' (+ optimum) loader: interoperability in both directions.

Every quantizer runs as a subprocess under `/usr/bin/time -v` (process wall, peak RSS), one
after the other on the same machine; the quantize step's own time comes from each tool's log.
Peers live in their own virtualenvs under runs/ (built here when missing, pinned, never
project dependencies): GPTQModel 7.6.0 (scripts/setup_peer_venv.sh) and AutoAWQ 0.2.9 (with
transformers 4.51.3, the last it supports); qcal/studies/peer_worker.py drives them. Each step's
result is kept in qcal's step cache under runs/, so an interrupted run resumes.
`qcal report --study peers` (or gptq-vs-peer) renders a table again from its JSON.

    python scripts/bench_peers.py [--autoawq-layers 3 | --autoawq-full] [--fresh]
    python scripts/bench_peers.py --loaders [--max-windows 16] [--desc-act] [--fresh]
    python scripts/bench_peers.py --scale --model qwen2.5-coder-1.5b [--layers N]
        (results/peers_scale[_L<N>].{json,md}: GPTQ and AWQ, qcal vs GPTQModel, at 1.5B)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from qcal.calib import resolve_calib
from qcal.data import eval_text
from qcal.eval.perplexity import tokenize_text
from qcal.model.loading import load_model, resolve_model_dir
from qcal.paths import results_dir, runs_dir
from qcal.studies.bench import Steps, provenance, write_results
from qcal.studies.peers import (
    AUTOAWQ_PINS,
    AUTOAWQ_PROBE,
    BASELINE_REV,
    GPTQMODEL_PROBE,
    baseline_source,
    ensure_autoawq,
    ensure_gptqmodel,
    peer_run,
    peer_venv,
    peer_version,
    qcal_ppl,
    qcal_run,
)
from qcal.studies.peers_report import render_loaders, render_speed
from qcal.studies.peers_scale import scale_suite
from qcal.studies.tables import shown

# The project folder: results name paths relative to it.
PROJECT = Path(__file__).resolve().parent.parent


def speed_suite(args: argparse.Namespace, model_dir: Path, calib: Any, windows: Any) -> None:
    layers = 0 if args.autoawq_full else args.autoawq_layers
    digest = calib.manifest.get("digest")
    setting = {"calib": digest, "gptq_group": args.gptq_group, "awq_group": args.awq_group,
               "baseline_rev": args.baseline_rev, "autoawq_layers": layers,
               "windows": windows.shape[0], "awq_seeds": args.awq_seeds}
    work = runs_dir() / "bench_peers"
    steps = Steps(work, setting, args.fresh, args.only)
    save_file({"ids": calib.input_ids.contiguous()}, str(work / "calib.safetensors"))
    common = ["--model", str(model_dir), "--calib", args.calib, "--nsamples", str(args.nsamples), "--seqlen",
              str(args.seqlen), "--device", "cpu", "--overwrite"]
    gptq = ["--method", "gptq", "--bits", "4", "--group-size", str(args.gptq_group),
            "--allow-ragged-groups", "--format", "gptq", "--sym", "--damp", "0.01", *common]
    awq = ["--method", "awq", "--bits", "4", "--group-size", str(args.awq_group), *common]

    def wanted(step: str) -> bool:
        return args.only is None or step in args.only

    steps.run("qcal-gptq", lambda: qcal_run(work / "qcal-gptq", [*gptq, "--seed", str(args.seed)],
                                            digest))
    gm_python = ensure_gptqmodel(args.peer_venv) if wanted("gptqmodel") else None
    steps.run("gptqmodel", lambda: peer_run(
        gm_python, ["gptqmodel", str(model_dir), str(work / "calib.safetensors"),
                    str(work / "gptqmodel"), str(work / "gptqmodel.json"), "--sym", "--group",
                    str(args.gptq_group)], work / "gptqmodel.json", {"GPTQMODEL_CPU_WORKERS": "2"}))

    def baseline() -> Path:
        return baseline_source(args.baseline_rev, work / "baseline-src")

    for seed in [args.seed, *args.awq_seeds]:  # more calibration draws: AWQ's quality
        tag = "" if seed == args.seed else f"/s{seed}"
        flags = [*awq, "--seed", str(seed)]
        same = digest if seed == args.seed else None
        steps.run(f"qcal-awq{tag}", lambda t=tag, f=flags, d=same: qcal_run(
            work / f"qcal-awq{t.replace('/', '-')}", f, d))
        steps.run(f"qcal-awq-baseline{tag}", lambda t=tag, f=flags, d=same: qcal_run(
            work / f"qcal-awq-baseline{t.replace('/', '-')}", f, d, baseline()))
    aa_python = ensure_autoawq(runs_dir() / "awq-venv") if wanted("autoawq") else None
    steps.run("autoawq", lambda: peer_run(
        aa_python, ["autoawq", str(model_dir), str(work / "calib.safetensors"),
                    str(work / "autoawq"), str(work / "autoawq.json"), "--group",
                    str(args.awq_group), "--max-layers", str(layers)], work / "autoawq.json"))
    steps.run("ppl/float", lambda: qcal_ppl(model_dir, windows))
    extra = [f"{v}/s{seed}" for seed in args.awq_seeds for v in ("qcal-awq", "qcal-awq-baseline")]
    for name in ("qcal-gptq", "gptqmodel", "qcal-awq", "qcal-awq-baseline", "autoawq", *extra):
        run = steps.get(name)
        if run and run["returncode"] == 0 and run.get("finished", True):
            steps.run(f"ppl/{name}", lambda n=name: qcal_ppl(work / n.replace("/", "-"), windows))
    file_mib = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 2**20
    data = {"setting": setting, "state": {"setting": setting, **steps.results},
            "model_file_mib": round(file_mib, 1),
            "n_layers": json.loads((model_dir / "config.json").read_text())["num_hidden_layers"],
            "provenance": provenance(
        model=shown(model_dir, PROJECT), calibration=f"{args.calib}, random selector, {args.nsamples} x "
        f"{args.seqlen}, seed {args.seed} (digest {digest[:12]}); the same ids for every quantizer",
        evaluation=f"qcal's loader and scorer, all {windows.shape[0]} held-out English windows "
                   "of 512",
        peers="; ".join([
            peer_version(gm_python, "import gptqmodel, transformers; print('GPTQModel', "
                         "gptqmodel.__version__, 'transformers', transformers.__version__)",
                         "GPTQModel"),
            peer_version(aa_python, AUTOAWQ_PROBE, "AutoAWQ")]),
        peer_install="scripts/setup_peer_venv.sh (GPTQModel 7.6.0, torch 2.13.0 CPU); "
                     f"python -m venv runs/awq-venv && pip install {' '.join(AUTOAWQ_PINS)}")}
    out = args.out or results_dir() / "peers"
    write_results(out, data, render_speed(data))
    print(f"wrote {out}.json/.md")


def loaders_suite(args: argparse.Namespace, model_dir: Path, calib: Any, windows: Any) -> None:
    sym, act = not args.asym, args.desc_act
    digest = calib.manifest.get("digest")
    setting = {"model": str(model_dir), "calib": digest, "sym": sym, "desc_act": act,
               "windows": windows.shape[0], "eval_seqlen": windows.shape[1]}
    work = runs_dir() / f"bench_gptq_vs_peer{'_act' if act else ''}"
    steps = Steps(work, setting, args.fresh)
    # safetensors, not pickle: the peer's venv reads ids without being able to run code.
    save_file({"ids": calib.input_ids.contiguous()}, str(work / "calib.safetensors"))
    save_file({"ids": windows.contiguous()}, str(work / "windows.safetensors"))
    python = ensure_gptqmodel(args.peer_venv)
    flags = [*(["--sym"] if sym else []), *(["--desc-act"] if act else [])]
    qcal_dir, peer_dir = work / "qcal-gptq", work / "peer-gptq"
    qcal_args = ["--model", str(model_dir), "--method", "gptq", "--bits", "4", "--group-size",
                 "128", "--allow-ragged-groups", "--format", "gptq", *flags, "--damp", "0.01",
                 "--calib", args.calib,
                 "--nsamples", str(args.nsamples), "--seqlen", str(args.seqlen), "--seed",
                 str(args.seed)]

    def run_qcal() -> dict[str, Any]:
        run = qcal_run(qcal_dir, qcal_args, digest)
        run["same_calibration_digest"] = run.pop("same_calibration", None)
        return run

    def peer_ppl(path: Path, command: str) -> dict[str, Any]:
        result = work / f"peer-{command}-{path.name}.json"
        # TORCHDYNAMO_DISABLE: GPTQModel's torch kernel otherwise recompiles per input shape.
        run = peer_run(python, [command, str(path), str(work / "windows.safetensors"),
                                str(result)], result,
                       {"GPTQMODEL_CPU_WORKERS": "2", "TORCHDYNAMO_DISABLE": "1"})
        # The error itself, without the report `time -v` appends to the same stream.
        tail = re.split(r"Command exited with|\tCommand being timed", run.get("error_tail", ""))[0]
        return run if run["returncode"] == 0 else {"error": tail[-1500:]}

    runs = {"qcal": steps.run("qcal_quantize", run_qcal),
            "gptqmodel": steps.run("peer_quantize", lambda: peer_run(
                python, ["gptqmodel", str(model_dir), str(work / "calib.safetensors"),
                         str(peer_dir), str(work / "peer-quant.json"), *flags],
                work / "peer-quant.json", {"GPTQMODEL_CPU_WORKERS": "2"}))}
    rows: dict[str, dict[str, Any]] = {}
    for name, path in (("qcal", qcal_dir), ("gptqmodel", peer_dir)):
        ok = runs[name]["returncode"] == 0
        rows[name] = {"run": runs[name]} | ({
            "qcal_loader": steps.run(f"{name}/qcal_loader",
                                     lambda p=path: qcal_ppl(p, windows, fail_soft=True)),
            "gptqmodel_loader": steps.run(f"{name}/gptqmodel_loader",
                                          lambda p=path: peer_ppl(p, "ppl")),
            "transformers_loader": steps.run(f"{name}/transformers_loader",
                                             lambda p=path: peer_ppl(p, "hf-ppl")),
        } if ok else dict.fromkeys(("qcal_loader", "gptqmodel_loader", "transformers_loader")))
        if ok:
            qc = json.loads((path / "config.json").read_text()).get("quantization_config", {})
            rows[name]["quantization_config"] = {
                k: qc.get(k) for k in ("quant_method", "bits", "group_size", "sym", "desc_act",
                                       "checkpoint_format")}
    fp = steps.run("fp_ppl", lambda: qcal_ppl(model_dir, windows)["ppl"])
    prov = provenance(
        model=shown(model_dir, PROJECT), calibration=digest,
        calib_setup=f"{args.calib}, selector random, {args.nsamples} x {args.seqlen}, "
                    f"seed {args.seed}",
        evaluation=f"qcal.data.eval_text('en'), {windows.shape[0]} windows of {windows.shape[1]}",
        peer=peer_version(python, GPTQMODEL_PROBE, "GPTQModel"),
        peer_install="scripts/setup_peer_venv.sh (GPTQModel 7.6.0 + optimum, torch 2.13.0 CPU); "
                     "run with GPTQMODEL_CPU_WORKERS=2")
    data = {"provenance": prov, "fp_ppl": fp, "sym": sym, "desc_act": act, "rows": rows}
    out = args.out or results_dir() / ("gptq_vs_peer_act" if act else "gptq_vs_peer")
    write_results(out, data, render_loaders(data))
    print(f"wrote {out}.json/.md")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loaders", action="store_true",
                   help="the GPTQ interoperability suite (results/gptq_vs_peer) instead")
    p.add_argument("--model", default=None, help="float HF model dir (default: the embedded model)")
    p.add_argument("--nsamples", type=int, default=None, help="default 32; 128 with --loaders")
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--calib", default="debian-handbook")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-windows", type=int, default=None, help="held-out windows of 512")
    p.add_argument("--peer-venv", type=Path, default=peer_venv(),
                   help="GPTQModel's virtualenv (made by scripts/setup_peer_venv.sh if missing)")
    p.add_argument("--fresh", action="store_true", help="discard cached steps and start over")
    p.add_argument("--out", type=Path, default=None, help="results stem")
    speed = p.add_argument_group("speed suite")
    speed.add_argument("--gptq-group", type=int, default=128)
    speed.add_argument("--awq-group", type=int, default=64,
                       help="64: AutoAWQ needs the group size to divide every in_features (576)")
    speed.add_argument("--baseline-rev", default=BASELINE_REV)
    speed.add_argument("--awq-seeds", type=int, nargs="*", default=[1],
                       help="further calibration seeds for both qcal AWQ runs (quality)")
    speed.add_argument("--autoawq-layers", type=int, default=3,
                       help="time AutoAWQ's first N layers only (0: the whole model)")
    speed.add_argument("--autoawq-full", action="store_true")
    speed.add_argument("--only", nargs="*", default=None,
                       help="steps to run (qcal-gptq gptqmodel qcal-awq qcal-awq-baseline autoawq)")
    scale = p.add_argument_group("--scale suite")
    scale.add_argument("--scale", action="store_true",
                       help="GPTQ act-order and AWQ, qcal vs GPTQModel (results/peers_scale)")
    scale.add_argument("--layers", type=int, default=None,
                       help="time on a copy of the model's first N layers (no perplexity)")
    loaders = p.add_argument_group("--loaders suite")
    loaders.add_argument("--asym", action="store_true", help="asymmetric grid (default symmetric)")
    loaders.add_argument("--desc-act", action="store_true", help="act-order in both quantizers")
    args = p.parse_args()
    args.nsamples = args.nsamples or (128 if args.loaders else 32)
    model_dir = resolve_model_dir(args.model)
    _, tok, _ = load_model(model_dir)
    calib = resolve_calib(args.calib, tok, nsamples=args.nsamples, seqlen=args.seqlen,
                          seed=args.seed)
    ids = tokenize_text(tok, eval_text("en"))
    n = min(ids.numel() // 512, args.max_windows or ids.numel())
    windows = ids[: n * 512].view(n, 512)
    if args.scale:
        scale_suite(args, model_dir, calib, windows, PROJECT)
    else:
        (loaders_suite if args.loaders else speed_suite)(args, model_dir, calib, windows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
