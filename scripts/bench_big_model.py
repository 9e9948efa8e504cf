#!/usr/bin/env python
"""Models bigger than memory: peak RSS, wall time, s/layer and disk written of `qcal quantize`
(RTN, GPTQ, AWQ) and `qcal eval` on random Llama-shaped bf16 models (issue 36).

Every step runs as a subprocess under `/usr/bin/time -v` (wall clock, peak resident set,
file-system output blocks), one after the other; the load average is read before and
after each step (the machine may be shared: compare only ratios measured in one run).
Random weights (scripts/make_random_model.py) measure memory and time, never quality.
Each finished step is kept in runs/bench_big_model/state-<shape>-<step>.json, so a rerun
skips it;
results/big_model.{json,md} are rewritten from that state after every step.

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

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = ROOT / "runs" / "bench_big_model"
PY = sys.executable
GPTQ_ARGS = ["--nsamples", "16", "--seqlen", "512"]
# gptqmodel: GPTQModel on the same files and calibration ids, in float32 (what qcal computes
# in) or, -bf16, in the stored dtype (GPTQModel's CPU default).
STEPS = ("rtn", "gptq", "awq", "eval", "gptqmodel", "gptqmodel-bf16")
PEER_VENV = ROOT / "runs" / "peer-venv"  # scripts/setup_peer_venv.sh


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
        subprocess.run([PY, str(ROOT / "scripts" / "make_random_model.py"), "--shape", shape,
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
        return [str(PEER_VENV / "bin" / "python"), str(ROOT / "scripts" / "peer_worker.py"),
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


def _time_field(text: str, label: str) -> str | None:
    match = re.search(rf"{re.escape(label)}: (.+)", text)
    return match.group(1).strip() if match else None


def _wall_seconds(value: str) -> float:
    parts = [float(p) for p in value.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def _cpu_seconds(text: str) -> float | None:
    """User + system CPU seconds: the work done, whatever the load on a shared machine."""
    user, system = _time_field(text, "User time (seconds)"), _time_field(text, "System time (seconds)")
    return round(float(user) + float(system), 1) if user and system else None


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    log = STATE_DIR / f"{shape}-{step}{'+resume' if resume else ''}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(["/usr/bin/time", "-v", *cmd], stdout=sink,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        stopped = _wait(proc, started + timeout_s if timeout_s else None, rss_limit_gib)
    text = log.read_text()
    shown = ["python", *cmd[1:]] if step.startswith("gptqmodel") else ["qcal", *cmd[3:]]
    row: dict[str, Any] = {
        "shape": shape, "step": step + ("+resume" if resume else ""),
        "exit": stopped or proc.returncode,
        "command": " ".join(shown).replace(str(ROOT) + "/", ""),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "commit": commit,
        "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2),
        "wall_s": _wall_seconds(_time_field(text, "Elapsed (wall clock) time (h:mm:ss or m:ss)")
                                or "0"),
        "peak_rss_gib": round(int(_time_field(text, "Maximum resident set size (kbytes)")
                                  or 0) / 2**20, 2),
        "cpu_percent": _time_field(text, "Percent of CPU this job got"),
        "cpu_s": _cpu_seconds(text),
        "disk_written_gb": round(int(_time_field(text, "File system outputs") or 0)
                                 * 512 / 1e9, 2),
        "output_gb": round(dir_bytes(out) / 1e9, 2),
        **_layer_times(Path(str(out) + ".work"), started),
    }
    qlog = out / "quant_log.json"
    if qlog.is_file():
        seconds = float(json.loads(qlog.read_text())["quantize_seconds"])
        layers = json.loads((model_dir(shape) / "config.json").read_text())["num_hidden_layers"]
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
    if step == "eval" and proc.returncode == 0:
        ppl = re.findall(r'"ppl":\s*([0-9.eE+-]+|NaN|Infinity)', text)
        row["ppl"] = ppl[0] if ppl else None
    return row


def _wait(proc: subprocess.Popen, deadline: float | None, rss_limit_gib: float) -> str | None:
    """Wait for `proc`; at `deadline`, or when its processes hold more than `rss_limit_gib`
    resident (stopped before the machine runs out: it has no swap), interrupt it (SIGINT:
    qcal keeps finished layers for --resume) and say why; None when it ended by itself."""
    import signal

    import psutil

    while proc.poll() is None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            break
        rss = sum(_rss(c) for c in children) / 2**30
        why = ("stopped (time limit)" if deadline is not None and time.time() > deadline
               else f"stopped (RSS over {rss_limit_gib:g} GiB)" if rss > rss_limit_gib else None)
        if why and why.startswith("stopped (RSS"):
            for child in children:  # no grace period: it is still growing
                child.kill()
            proc.wait()
            return why
        if why:
            for child in children:
                child.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                # Kill qcal, not /usr/bin/time: time still reports the peak and CPU time.
                for child in children:
                    child.kill()
                proc.wait()
            return why
        time.sleep(1)
    return None


def _rss(process: Any) -> int:
    try:
        return int(process.memory_info().rss)
    except Exception:  # gone between the listing and the read
        return 0


def _layer_times(work: Path, started: float) -> dict[str, Any]:
    """Layers finished and seconds per layer from the work dir's per-layer files (kept when
    a run is stopped; --keep-work otherwise)."""
    stamps = sorted(f.stat().st_mtime for f in work.glob("layer_*.safetensors"))
    if not stamps:
        return {}
    out: dict[str, Any] = {"layers_done": len(stamps),
                           "first_layer_done_s": round(stamps[0] - started, 1)}
    if len(stamps) > 1:
        out["s_per_layer_after_first"] = round((stamps[-1] - stamps[0]) / (len(stamps) - 1), 1)
    return out


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Models bigger than memory (issue 36)",
        "",
        "Random Llama-shaped bf16 models from `scripts/make_random_model.py` (memory and time "
        "only, never quality), quantized and evaluated on the CPU by "
        "`python scripts/bench_big_model.py` (one run per row, under `/usr/bin/time -v`).",
        "Machine: 2 CPU cores, 24 GiB RAM, no swap, shared with other jobs: the load "
        "average before and after each step is recorded; wall times under load are upper bounds.",
        "Disk written is the process's file-system output (512-byte blocks), work-dir "
        "state and the assembled checkpoint included.",
        "",
        "| shape | step | exit | wall s | quantize s | s/layer | layers done | first layer s | "
        "s/layer after first | peak RSS GiB | CPU | CPU s | disk written GB | output GB | "
        "load avg before/after | started (UTC) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['step']} | {r['exit']} | {r['wall_s']:.0f} | "
            f"{r.get('quantize_s', '-')} | {r.get('s_per_layer', '-')} | {r.get('layers_done', '-')} | "
            f"{r.get('first_layer_done_s', '-')} | {r.get('s_per_layer_after_first', '-')} | "
            f"{r['peak_rss_gib'] if r['peak_rss_gib'] is not None else '-'} | "
            f"{r['cpu_percent'] or '-'} | {r.get('cpu_s') or '-'} | {r['disk_written_gb']} | "
            f"{r['output_gb']} | "
            f"{r['load_before']}/{r['load_after']} | {r['started']} |")
    lines += ["", "Commands (paths relative to the checkout):", ""]
    lines += [f"- {r['shape']} {r['step']}: `{r['command']}` (git commit {r.get('commit', '?')})"
              for r in rows]
    done = {(r["shape"], r["step"]) for r in rows if r["exit"] == 0}
    stopped = [f"{r['shape']} {r['step']} ({r.get('layers_done', 0)} layers done)"
               for r in rows if r["exit"] != 0]
    missing = [f"{shape} {step}" for shape, step in PLANNED if (shape, step) not in done
               and not any(x.startswith(f"{shape} {step} ") for x in stopped)]
    lines += ["", "Columns: `quantize s` is the quantize step's own time (quant_log.json); "
              "`layers done`, `first layer s` (from the start of the process: loading and "
              "calibration included) and `s/layer after first` come from the per-layer files "
              "in `<output>.work`, so they exist for a step stopped at its time limit too. "
              "For GPTQModel (`gptqmodel` in float32, `gptqmodel-bf16` in the stored dtype; "
              "its own venv, scripts/peer_worker.py, the same calibration ids) they come from "
              "its layer callback, timed from the end of loading."]
    lines += ["", "Where the time goes (from the code, for reading the rows): before the first "
              "layer, `qcal quantize` reads every weight file once to refuse NaN/Inf weights and "
              "truncated files before any work (a full extra read of the float files: most of "
              "`first layer s` for RTN); after the last layer, the checkpoint is assembled from "
              "the per-layer files in `<output>.work` in two passes (plan the shards, then write "
              "them), so the packed layers are written twice and read twice. `qcal eval` keeps a "
              "float32 dequantized copy of each linear only when all of them together fit in a "
              "quarter of the available RAM (a 1B model does, an 8B one does not), so the eval "
              "peak of a model that fits is its float32 size, by design."]
    lines += [f"- Note on {r['shape']} {r['step']}: {r['note']}" for r in rows if r.get("note")]
    if stopped:
        lines += ["", "Stopped before all layers (the exit column says why: `--timeout`, or "
                  "`--rss-limit` before the machine ran out of memory): " + "; ".join(stopped)
                  + ". Their peak RSS is the peak up to the stop."]
    if missing:
        lines += ["", "Not measured yet (issue 36's plan): " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


PLANNED = (("1b", "rtn"), ("1b", "gptq"), ("1b", "awq"), ("1b", "eval"), ("1b", "gptqmodel"),
           ("8b", "rtn"), ("8b", "gptq"), ("8b", "eval"), ("8b", "gptqmodel"),
           ("8b", "gptqmodel-bf16"))


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
                                                           STEPS.index(k.split("/")[1].split("+")[0]),
                                                           k))]
    results = ROOT / "results"
    (results / "big_model.json").write_text(json.dumps(rows, indent=2))
    (results / "big_model.md").write_text(render(rows))


if __name__ == "__main__":
    sys.exit(main())
