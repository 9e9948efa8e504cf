"""A user's journeys on a real model, one command each (results/scale_1p5b.{json,md}):
`qcal quantize` with RTN, GPTQ (act-order) and AWQ at w4 g128 (streamed from the shards),
`qcal eval --ppl` in three languages against the float model, `qcal eval --tasks ...
--confidence --base` for accuracy with paired differences, the checkpoint answering a chat
prompt in bare transformers, and `lm_eval --model hf` loading it. Every command runs as a
subprocess under `/usr/bin/time -v` (wall, peak RSS, load average), one after the other; each
finished step is cached under runs/, so a run stopped anywhere resumes.

    python -m qcal.studies.scale_journeys [--model qwen2.5-coder-1.5b] [--steps quantize/rtn,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qcal.cli import command_prefix
from qcal.model.loading import resolve_model_dir
from qcal.paths import qcal_home, results_dir, runs_dir
from qcal.studies.bench import Steps, provenance, timed, write_results
from qcal.studies.interop import lm_eval_cli
from qcal.studies.peers import WORKER_ARGS
from qcal.studies.scale_report import paired_accuracy, render_journeys
from qcal.studies.tables import shown

CALIB = ["--calib", "debian-handbook", "--nsamples", "32", "--seqlen", "512", "--seed", "0"]
# Checkpoint name -> `qcal quantize` flags; the default format (compressed-tensors) throughout.
QUANTIZE = {
    "rtn": ["--method", "rtn", "--bits", "4", "--group-size", "128"],
    "gptq": ["--method", "gptq", "--desc-act", "--bits", "4", "--group-size", "128", *CALIB],
    "awq": ["--method", "awq", "--bits", "4", "--group-size", "128", *CALIB],
}
PPL = ["--ppl", "--langs", "en,de,zh", "--max-windows", "8"]
TASKS = ["--tasks", "arc_easy,hellaswag,piqa", "--confidence", "--limit", "500"]
PROMPT = "Write a Python function that reverses a string."
KINDS = ("quantize", "ppl", "eval-alone", "tasks", "generate", "lm-eval")
# The checkpoint alone (no float base beside it): the memory a user's `qcal eval` needs.
ALONE = ["--ppl", "--langs", "en", "--max-windows", "2"]


def default_steps() -> list[str]:
    return [f"{kind}/{name}" for name in QUANTIZE for kind in KINDS]


def _qcal(args: list[str]) -> dict[str, Any]:
    return timed([*command_prefix(), *args], cwd=qcal_home())


def _with_json(run: dict[str, Any], stem: Path) -> dict[str, Any]:
    if run["returncode"] == 0 and stem.with_suffix(".json").is_file():
        run["result"] = stem.with_suffix(".json").name
    return run


def run_step(step: str, model: Path, work: Path, scores: Path) -> dict[str, Any]:
    """One journey step; its result names the files it wrote under `work`. `scores` holds
    the tasks evals' per-request scores (committed beside the results: hours of scoring
    that a fresh checkout resumes instead of redoing)."""
    kind, name = step.split("/", 1)
    ckpt = work / f"{name}-w4g128"
    if kind == "quantize":
        run = _qcal(["quantize", "--model", str(model), *QUANTIZE[name], "-o", str(ckpt),
                     "--overwrite"])
        if run["returncode"] == 0:
            log = json.loads((ckpt / "quant_log.json").read_text())
            run["quantize_seconds"] = log["quantize_seconds"]
            run["checkpoint_mib"] = round(sum(f.stat().st_size for f in ckpt.glob(
                "*.safetensors")) / 2**20, 1)
        return run
    if not (ckpt / "config.json").is_file():
        return {"returncode": 1, "error_tail": f"no checkpoint {ckpt.name}: run quantize/{name}"}
    if kind in ("ppl", "tasks"):
        stem = work / f"eval-{kind}-{name}"
        # One score folder for every tasks eval: the float base is scored once, and a run
        # stopped by the session's end resumes where it stopped.
        flags = PPL if kind == "ppl" else [*TASKS, "--scores", str(scores)]
        return _with_json(_qcal(["eval", "--model", str(ckpt), "--base", str(model), *flags,
                                 "-o", str(stem), "--overwrite"]), stem)
    if kind == "eval-alone":
        stem = work / f"eval-alone-{name}"
        return _with_json(_qcal(["eval", "--model", str(ckpt), *ALONE, "-o", str(stem),
                                 "--overwrite"]), stem)
    if kind == "generate":
        prompt, result = work / "prompt.txt", work / f"generate-{name}.json"
        prompt.write_text(PROMPT + "\n")
        # The project's python, but the worker imports no qcal: bare transformers loads it.
        run = timed([sys.executable, *WORKER_ARGS, "hf-generate", str(ckpt), str(prompt),
                     str(result)], env={"PYTHONPATH": ""}, cwd=qcal_home())
        if run["returncode"] == 0:
            run.update(json.loads(result.read_text()))
        return run
    if kind == "lm-eval":
        try:
            return {"returncode": 0, **lm_eval_cli(ckpt, work)}
        except RuntimeError as err:
            return {"returncode": 1, "error_tail": str(err)}
    raise SystemExit(f"unknown step {step!r}; kinds: {', '.join(KINDS)}")


def restore(steps: Steps, data: dict[str, Any], source: str, work: Path, model_name: str,
            flags: dict[str, Any]) -> list[str]:
    """Put back the finished steps a committed results JSON (`data`, read from the file
    named `source`) holds and `work` lacks (runs/ does not survive a fresh checkout), with
    the eval JSON each names, so they are not run again; only when that JSON is of the same
    model and flags. Each restored record says where and when it was measured."""
    if data.get("model") != model_name or data.get("flags") != flags:
        return []
    prov = data.get("provenance", {})
    machine = (prov.get("machine") or {}).get("cpu")
    origin = (f"{source} ({prov.get('date')}, commit {prov.get('git_commit')}"
              + (f", {machine}" if machine else "") + ")")
    restored = []
    for key, run in data.get("state", {}).items():
        if not isinstance(run, dict) or run.get("returncode") != 0 or steps.get(key) is not None:
            continue
        if run.get("result"):
            if key not in data.get("evals", {}):
                continue
            (work / run["result"]).write_text(json.dumps(data["evals"][key]))
        steps.cache.run(key, lambda r=run: {**r, "restored_from": r.get("restored_from", origin)})
        restored.append(key)
    return restored


def _needs_checkpoint(steps: Steps, step: str, work: Path) -> str | None:
    """The quantize step to run again when `step` will run and its checkpoint is gone
    (its quantize record was restored from results, the files were not)."""
    kind, name = step.split("/", 1)
    if kind == "quantize" or steps.get(step) is not None:
        return None
    return None if (work / f"{name}-w4g128" / "config.json").is_file() else f"quantize/{name}"


def _paired(work: Path, key: str, previous: dict[str, Any]) -> Any:
    items = work / f"eval-tasks-{key.split('/')[1]}_items.jsonl"
    return paired_accuracy(items) if items.is_file() else previous.get(key)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--steps", default=None,
                   help="comma-separated KIND/NAME steps (default: all, in order: "
                        f"{', '.join(KINDS)} for each of {', '.join(QUANTIZE)})")
    p.add_argument("--out", type=Path, default=None, help="results stem")
    p.add_argument("--fresh", action="store_true", help="discard cached steps")
    args = p.parse_args(argv)
    model = resolve_model_dir(args.model)
    steps = args.steps.split(",") if args.steps else default_steps()
    bad = [s for s in steps if s.split("/")[0] not in KINDS or s.split("/")[-1] not in QUANTIZE]
    if bad:
        raise SystemExit(f"unknown steps {bad}; use KIND/NAME with KIND in {KINDS} and NAME "
                         f"in {tuple(QUANTIZE)}")
    work = runs_dir() / "scale_journeys" / model.name
    cache = Steps(work, {"model": model.name, "calib": CALIB}, args.fresh)
    flags = {"quantize": QUANTIZE, "ppl": PPL, "tasks": TASKS, "eval-alone": ALONE}
    out = args.out or results_dir() / "scale_1p5b"
    source = out.with_suffix(".json")
    scores = out.with_name(out.name + "_scores")
    previous = json.loads(source.read_text()) if source.is_file() else {}
    restored = [] if args.fresh else restore(cache, previous, source.name, work, model.name,
                                             flags)
    if restored:
        print(f"restored from {out.name}.json: {', '.join(restored)}")
    for step in steps:
        redo = _needs_checkpoint(cache, step, work)
        if redo is not None:
            # Rebuilt files only: the quantize step's own record (its time and memory, often
            # measured on a quieter machine) stays; the rebuild is kept beside it.
            rebuilt = run_step(redo, model, work, scores)
            cache.cache.run(f"rebuild/{redo}", lambda r=rebuilt: r, lambda _: True)
            if rebuilt["returncode"] != 0:
                raise SystemExit(f"rebuilding {redo} failed: {rebuilt.get('error_tail', '')}")
        cache.run(step, lambda s=step: run_step(s, model, work, scores))
    project = qcal_home()
    done = {k: v for k, v in cache.results.items() if isinstance(v, dict) and v.get("result")}
    command = " ".join(["python -m qcal.studies.scale_journeys",
                        *(argv if argv is not None else sys.argv[1:])])
    data = {"model": model.name, "state": cache.results, "work": shown(work, project),
            "prompt": PROMPT, "flags": flags,
            "evals": {k: json.loads((work / v["result"]).read_text()) for k, v in done.items()},
            "peer_pages": sorted(p.name for p in results_dir().glob("peers_scale*.md")),
            "paired": {k: _paired(work, k, previous.get("paired", {}))
                       for k in done if k.startswith("tasks/")},
            "provenance": provenance(command=command, model=shown(model, project),
                                     calibration=" ".join(CALIB) + " (random windows)")}
    write_results(out, data, render_journeys(data))
    print(f"wrote {out}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
