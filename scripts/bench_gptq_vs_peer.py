"""qcal GPTQ vs GPTQModel on the same model, calibration ids and held-out text, in one run.

Both quantizers run as subprocesses under `/usr/bin/time -v` (wall time, peak RSS),
one after the other, with matched settings (w4 g128, damp 0.01, act-order with --desc-act).
GPTQModel lives in its own virtualenv (`--peer-python`); scripts/peer_gptqmodel_worker.py
drives it. Then qcal's loader scores both checkpoints on the same windows, and
GPTQModel's loader scores both too (interoperability in both directions).

    python scripts/bench_gptq_vs_peer.py --peer-python /tmp/peer-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
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

WORKER = Path(__file__).with_name("peer_gptqmodel_worker.py")


def timed(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `cmd` under /usr/bin/time -v; wall seconds, max RSS, and the failure if any."""
    print("$", shlex.join(cmd), flush=True)
    out = timed_command(cmd, env=env)
    if out["returncode"] != 0:
        print(out["error_tail"], file=sys.stderr)
    return out


def qcal_ppl(path: Path, windows: torch.Tensor) -> dict[str, Any]:
    try:
        net, _, _ = load_model(path)
    except Exception as err:  # noqa: BLE001 - the failure is the result we report
        return {"error": f"{type(err).__name__}: {err}"}
    res = perplexity_of_ids(net, windows.reshape(-1), windows.shape[1], None, 4, None,
                            progress=True, desc=f"qcal-ppl[{path.name}]")
    return {"ppl": res.ppl, "tokens": res.tokens}


def peer_ppl(python: str, path: Path, windows_file: Path, tmp: Path,
             cmd: str = "ppl") -> dict[str, Any]:
    result = tmp / f"peer-{cmd}-{path.name}.json"
    # TORCHDYNAMO_DISABLE: GPTQModel's torch kernel otherwise recompiles per input shape.
    run = timed([python, str(WORKER), cmd, str(path), str(windows_file), str(result)],
                {"GPTQMODEL_CPU_WORKERS": "2", "TORCHDYNAMO_DISABLE": "1"})
    if run["returncode"] != 0:
        return {"error": run.get("error_tail", "")[-1500:]}
    return json.loads(result.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-python", default="/tmp/peer-venv/bin/python")
    p.add_argument("--model", default=None, help="float HF model dir (default: the embedded model)")
    p.add_argument("--calib", default="debian-handbook")
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--asym", action="store_true", help="asymmetric grid (default symmetric)")
    p.add_argument("--eval-seqlen", type=int, default=512)
    p.add_argument("--max-windows", type=int, default=None)
    p.add_argument("--desc-act", action="store_true", help="act-order in both quantizers")
    p.add_argument("--work", type=Path, default=None,
                   help="checkpoints and cached steps (default runs/bench_gptq_vs_peer[_act])")
    p.add_argument("--fresh", action="store_true", help="discard cached steps and start over")
    p.add_argument("--out", type=Path, default=None,
                   help="results stem (default results/gptq_vs_peer[_act])")
    args = p.parse_args()
    if args.out is None:
        args.out = results_dir() / ("gptq_vs_peer_act" if args.desc_act else "gptq_vs_peer")
    sym = not args.asym

    model_dir = resolve_model_dir(args.model)
    _, tok, _ = load_model(model_dir)
    calib = resolve_calib(args.calib, tok, nsamples=args.nsamples, seqlen=args.seqlen,
                          seed=args.seed)
    ids = tokenize_text(tok, eval_text("en"))
    n = ids.numel() // args.eval_seqlen
    if args.max_windows:
        n = min(n, args.max_windows)
    windows = ids[: n * args.eval_seqlen].view(n, args.eval_seqlen)
    setting = {"model": str(model_dir), "calib": calib.manifest.get("digest"), "sym": sym,
               "desc_act": args.desc_act, "windows": n, "eval_seqlen": args.eval_seqlen}

    # Every step's result is kept in qcal's step cache in <work>, next to the checkpoints, so
    # an interrupted run resumes; --fresh starts over.
    work = args.work or runs_dir() / f"bench_gptq_vs_peer{'_act' if args.desc_act else ''}"
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    steps = JsonSteps(StepCache(work), "steps", setting)
    if steps.other_settings():
        raise SystemExit(f"{work} holds a run with other settings; pass --fresh or --work")
    step = steps.run

    # safetensors, not pickle: the peer's venv reads ids without being able to run code.
    save_file({"ids": calib.input_ids.contiguous()}, str(work / "calib.safetensors"))
    save_file({"ids": windows.contiguous()}, str(work / "windows.safetensors"))
    qcal_dir, peer_dir = work / "qcal-gptq", work / "peer-gptq"
    qcal_cmd = [*command_prefix(), "quantize", "--model", str(model_dir),
                "--method", "gptq", "--bits", "4",
                "--group-size", "128", "--allow-ragged-groups", *(["--sym"] if sym else []),
                *(["--desc-act"] if args.desc_act else []), "--damp", "0.01",
                "--calib", args.calib, "--nsamples", str(args.nsamples), "--seqlen",
                str(args.seqlen), "--seed", str(args.seed), "-o", str(qcal_dir)]

    def run_qcal() -> dict[str, Any]:
        run = timed(qcal_cmd)
        if run["returncode"] == 0:
            log = json.loads((qcal_dir / "quant_log.json").read_text())
            run["quantize_seconds"] = log["quantize_seconds"]
            same = (log.get("calibration") or {}).get("digest") == calib.manifest.get("digest")
            run["same_calibration_digest"] = same
        return run

    def run_peer() -> dict[str, Any]:
        peer_result = work / "peer-quant.json"
        run = timed([args.peer_python, str(WORKER), "quantize", str(model_dir),
                     str(work / "calib.safetensors"), str(peer_dir), str(peer_result),
                     *(["--sym"] if sym else []), *(["--desc-act"] if args.desc_act else [])],
                    {"GPTQMODEL_CPU_WORKERS": "2"})
        if run["returncode"] == 0:
            run.update(json.loads(peer_result.read_text()))
        return run

    qcal_run = step("qcal_quantize", run_qcal)
    peer_run = step("peer_quantize", run_peer)
    rows: dict[str, dict[str, Any]] = {}
    for name, run, path in (("qcal", qcal_run, qcal_dir), ("gptqmodel", peer_run, peer_dir)):
        ok = run["returncode"] == 0
        rows[name] = {
            "run": run,
            "qcal_loader": step(f"{name}/qcal_loader", lambda p=path: qcal_ppl(p, windows))
            if ok else None,
            "gptqmodel_loader": step(f"{name}/gptqmodel_loader", lambda p=path: peer_ppl(
                args.peer_python, p, work / "windows.safetensors", work)) if ok else None,
            "transformers_loader": step(f"{name}/transformers_loader", lambda p=path: peer_ppl(
                args.peer_python, p, work / "windows.safetensors", work, "hf-ppl")) if ok else None,
        }
        if ok:
            qc = json.loads((path / "config.json").read_text()).get("quantization_config", {})
            rows[name]["quantization_config"] = {
                k: qc.get(k) for k in ("quant_method", "bits", "group_size", "sym", "desc_act",
                                       "checkpoint_format")}

    def fp_ppl() -> float:
        fp_net, _, _ = load_model(model_dir)
        return perplexity_of_ids(fp_net, windows.reshape(-1), args.eval_seqlen, None, 4, None,
                                 progress=True, desc="fp").ppl

    fp = step("fp_ppl", fp_ppl)

    prov = provenance(
        model=str(model_dir), calibration=calib.manifest.get("digest"),
        calib_setup=f"{args.calib}, selector random, {args.nsamples} x {args.seqlen}, seed {args.seed}",
        evaluation=f"qcal.data.eval_text('en'), {n} windows of {args.eval_seqlen}",
        peer=_peer_version(args.peer_python),
        peer_install="python3 -m venv /tmp/peer-venv; BUILD_CUDA_EXT=0 /tmp/peer-venv/bin/pip "
                     "install torch==2.13.0 gptqmodel==7.6.0 optimum; run with "
                     "GPTQMODEL_CPU_WORKERS=2",
    )
    data = {"provenance": prov, "fp_ppl": fp, "sym": sym, "desc_act": args.desc_act,
            "rows": rows}
    write_results(args.out, data, render(data))
    print(f"wrote {args.out}.json/.md")
    return 0


def _peer_version(python: str) -> str:
    probe = ("import gptqmodel, optimum.version as o, torch, transformers; "
             "print(f'gptqmodel {gptqmodel.__version__}, optimum {o.__version__}, "
             "torch {torch.__version__}, transformers {transformers.__version__}')")
    try:
        # cwd="/": with `-c` a checkout's kernels/ folder would shadow the peer's `kernels`.
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300,
                             cwd="/")
        return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else out.stderr[-500:]
    except (OSError, subprocess.TimeoutExpired, IndexError) as err:
        return f"unavailable: {err}"


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


def render(data: dict[str, Any]) -> str:
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


if __name__ == "__main__":
    sys.exit(main())
