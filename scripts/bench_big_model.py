#!/usr/bin/env python
"""Models bigger than memory: peak RSS, wall time, s/layer and disk written of `qcal quantize`
(RTN, GPTQ, AWQ) and `qcal eval` on random Llama-shaped bf16 models (issue 36).

Every step runs as a subprocess under `/usr/bin/time -v` (wall clock, peak resident set,
file-system output blocks), one after the other; the load average is read before and
after each step (the machine may be shared: compare only ratios measured in one run).
Random weights (`python -m qcal.studies.random_model`) measure memory and time, never quality.
Each finished step is kept in runs/bench_big_model/state-<shape>-<step>.json, so a rerun
skips it;
results/big_model.{json,md} are rewritten from that state after every step
(qcal.studies.big_model renders the page; `qcal report --study big-model` re-renders it).

    python scripts/bench_big_model.py --shape 1b --steps rtn,gptq,eval
    python scripts/bench_big_model.py --shape 8b --steps rtn
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from qcal.results import git_commit
from qcal.studies import big_model
from qcal.studies.bench import watched
from qcal.studies.peers import WORKER_ARGS, peer_venv

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = ROOT / "runs" / "bench_big_model"
PY = sys.executable
GPTQ_ARGS = ["--nsamples", "16", "--seqlen", "512"]
# gptqmodel: GPTQModel on the same files and calibration ids, in float32 (what qcal computes
# in) or, -bf16, in the stored dtype (GPTQModel's CPU default).
STEPS = ("rtn", "gptq", "awq", "eval", "gptqmodel", "gptqmodel-bf16")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / ".kpath"), env.get("PYTHONPATH", "")])
    return env


def model_dir(shape: str) -> Path:
    return ROOT / "runs" / f"random-{shape}"


def ensure_model(shape: str) -> Path:
    path = model_dir(shape)
    if not (path / "config.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([PY, "-m", "qcal.studies.random_model", "--shape", shape,
                        "-o", str(path)], check=True, env=_env(), cwd=ROOT)
    return path


def calib_ids(shape: str) -> Path:
    """The token ids `qcal quantize` calibrates on with GPTQ_ARGS (its default source,
    selector and seed), as safetensors for GPTQModel: both quantize from the same ids."""
    from safetensors.torch import save_file

    from qcal.calib import resolve_calib
    from qcal.model.loading import load_tokenizer

    path = STATE_DIR / f"{shape}-calib.safetensors"
    calib = resolve_calib("debian-handbook", load_tokenizer(model_dir(shape)),
                          nsamples=int(GPTQ_ARGS[1]), seqlen=int(GPTQ_ARGS[3]), seed=0)
    save_file({"ids": calib.input_ids.contiguous()}, str(path))
    return path


def step_command(shape: str, step: str, eval_of: str = "gptq",
                 eval_seqlen: int | None = None, resume: bool = False,
                 peer_layers: int = 0) -> tuple[list[str], Path]:
    src = model_dir(shape)
    out = STATE_DIR / f"{shape}-{step}"
    if step.startswith("gptqmodel"):  # stops after `peer_layers` layers (0: all)
        dtype = "bfloat16" if step.endswith("bf16") else "float32"
        return [str(peer_venv() / "bin" / "python"), *WORKER_ARGS,
                "gptqmodel", str(src), str(calib_ids(shape)), str(out), f"{out}.json",
                "--group", "128", "--dtype", dtype, "--max-layers", str(peer_layers)], out
    qcal = [PY, "-m", "qcal"]
    if step == "eval":
        return qcal + ["eval", "--model", str(STATE_DIR / f"{shape}-{eval_of}"), "--ppl",
                       "--max-windows", "1", "--device", "cpu", "-o", str(out),
                       *(["--seqlen", str(eval_seqlen)] if eval_seqlen else [])], out
    extra = GPTQ_ARGS if step in ("gptq", "awq") else []
    return qcal + ["quantize", "--model", str(src), "--method", step, "--group-size", "128",
                   "--device", "cpu", *extra, "-o", str(out),
                   "--resume" if resume else "--overwrite", "--keep-work"], out


def dir_bytes(path: Path, since: float = 0.0) -> int:
    """Bytes of the files under `path` written at or after `since` (a stopped run leaves an
    earlier run's checkpoint in place: it is not this run's output)."""
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.stat().st_mtime >= since)


def run_step(shape: str, step: str, timeout_s: float | None = None,
             eval_of: str = "gptq", eval_seqlen: int | None = None,
             resume: bool = False, peer_layers: int = 0,
             rss_limit_gib: float = 20.0) -> dict[str, Any]:
    cmd, out = step_command(shape, step, eval_of, eval_seqlen, resume, peer_layers)
    env = _env()
    if step.startswith("gptqmodel"):  # its own venv: a checkout on PYTHONPATH would shadow its packages
        env.pop("PYTHONPATH", None)
        env["GPTQMODEL_CPU_WORKERS"] = "2"
    load_before = os.getloadavg()
    started = time.time()
    commit = git_commit()  # the code that runs, not whatever is checked out when it ends
    log = STATE_DIR / f"{shape}-{step}{'+resume' if resume else ''}.log"
    run = watched(cmd, log, env=env, cwd=ROOT, rss_limit_gib=rss_limit_gib,
                  deadline=started + timeout_s if timeout_s else None)
    shown = ["python", *cmd[1:]] if step.startswith("gptqmodel") else ["qcal", *cmd[3:]]
    user, system = run["user_seconds"], run["system_seconds"]
    row: dict[str, Any] = {
        "shape": shape, "step": step + ("+resume" if resume else ""),
        "exit": run["stopped"] or run["returncode"],
        "command": " ".join(shown).replace(str(ROOT) + "/", ""),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "commit": commit,
        "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2),
        "wall_s": run["wall_seconds"] or 0.0,
        "peak_rss_gib": round((run["max_rss_mib"] or 0) / 1024, 2),
        "cpu_percent": f"{run['cpu_percent']:.0f}%" if run["cpu_percent"] is not None else None,
        # user + system: the work done, whatever the load on a shared machine
        "cpu_s": round(user + system, 1) if user is not None and system is not None else None,
        "disk_written_gb": round((run["fs_output_blocks"] or 0) * 512 / 1e9, 2),
        "output_gb": round(dir_bytes(out, since=started) / 1e9, 2),
        **_layer_times(Path(str(out) + ".work"), started),
    }
    qlog = out / "quant_log.json"
    if qlog.is_file() and qlog.stat().st_mtime >= started:
        seconds = float(json.loads(qlog.read_text())["quantize_seconds"])
        layers = json.loads((model_dir(shape) / "config.json").read_text())["num_hidden_layers"]
        # A resumed run quantized only the layers it wrote (the rest came from the work dir).
        layers = row.get("layers_done", layers) if resume else layers
        row["quantize_s"] = seconds
        row["s_per_layer"] = round(seconds / layers, 2)
    peer_json = Path(f"{out}.json")
    if step.startswith("gptqmodel") and peer_json.is_file():
        times = json.loads(peer_json.read_text())["layer_seconds"]
        row["layers_done"] = len(times)
        if times:
            row["first_layer_done_s"] = times[0]
            row["s_per_layer_after_first"] = (round(sum(times[1:]) / (len(times) - 1), 1)
                                              if len(times) > 1 else None)
    if step == "eval" and run["returncode"] == 0 and Path(f"{out}.json").is_file():
        # The result file qcal eval wrote (its log prints a table, not JSON).
        scores = json.loads(Path(f"{out}.json").read_text()).get("perplexity", {}).get("model", {})
        row["ppl"] = {lang: s.get("ppl") for lang, s in scores.items()} or None
    return row


def _layer_times(work: Path, started: float) -> dict[str, Any]:
    """Layers finished and seconds per layer from the work dir's per-layer files (kept when
    a run is stopped; --keep-work otherwise). Only files this run wrote count: a resumed
    run finds the layers of the run it continues there too."""
    stamps = sorted(t for t in (f.stat().st_mtime for f in work.glob("layer_*.safetensors"))
                    if t >= started)
    if not stamps:
        return {}
    out: dict[str, Any] = {"layers_done": len(stamps),
                           "first_layer_done_s": round(stamps[0] - started, 1)}
    if len(stamps) > 1:
        out["s_per_layer_after_first"] = round((stamps[-1] - stamps[0]) / (len(stamps) - 1), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("tiny", "1b", "8b"), required=True)
    ap.add_argument("--steps", default="rtn,gptq,eval", help=f"comma-separated, of {STEPS}")
    ap.add_argument("--fresh", action="store_true", help="re-run steps already in the state")
    ap.add_argument("--render-only", action="store_true", help="rewrite results from the state")
    ap.add_argument("--resume", action="store_true",
                    help="continue a stopped step from its work dir (recorded as <step>+resume)")
    ap.add_argument("--eval-of", choices=("rtn", "gptq", "awq"), default="gptq",
                    help="which of this shape's checkpoints the eval step scores")
    ap.add_argument("--eval-seqlen", type=int, default=None,
                    help="tokens of the eval step's one window (default: qcal eval's)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop a step after this many seconds and record the layers it finished")
    ap.add_argument("--peer-layers", type=int, default=0,
                    help="gptqmodel steps: stop after this many layers (0: all)")
    ap.add_argument("--rss-limit", type=float, default=20.0,
                    help="stop a step whose processes hold more GiB than this (no swap here)")
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    if any(s not in STEPS for s in steps):
        print(f"--steps takes {', '.join(STEPS)}", file=sys.stderr)
        return 2
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        write_results(load_state())
        return 0
    ensure_model(args.shape)
    for step in steps:
        key = f"{args.shape}/{step}" + ("+resume" if args.resume else "")
        state = load_state()
        if key in state and not args.fresh and state[key]["exit"] == 0:
            continue
        print(f"running {key} ...", flush=True)
        row = run_step(args.shape, step, args.timeout, args.eval_of, args.eval_seqlen,
                       args.resume, args.peer_layers, args.rss_limit)
        print(json.dumps(row), flush=True)
        # One file per step: runs of different shapes may go on side by side.
        (STATE_DIR / f"state-{args.shape}-{row['step']}.json").write_text(json.dumps(row, indent=2))
        write_results(load_state())
    state = load_state()
    tag = "+resume" if args.resume else ""
    return 0 if all(state[f"{args.shape}/{s}{tag}"]["exit"] == 0 for s in steps) else 1


def load_state() -> dict[str, dict[str, Any]]:
    rows = [json.loads(f.read_text()) for f in sorted(STATE_DIR.glob("state-*-*.json"))]
    return {f"{r['shape']}/{r['step']}": r for r in rows}


def write_results(state: dict[str, dict[str, Any]]) -> None:
    order = ("tiny", "1b", "8b")
    rows = [state[k] for k in sorted(state, key=lambda k: (order.index(k.split("/")[0]),
                                                           STEPS.index(re.split("[+@]", k.split("/")[1])[0]),
                                                           k))]
    big_model.write(rows, ROOT / "results" / "big_model")


if __name__ == "__main__":
    sys.exit(main())
