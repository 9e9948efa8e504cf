"""Where a GPTQ run's memory and time go: `qcal quantize` run in this process with its main
phases marked (layer-0 capture, each true-sequential step's calibration pass and Hessian
accumulation, the inverse Cholesky, the GPTQ column loop, packing, the final pass that makes
the next layer's inputs, loading a layer's weights, the rest), while a thread samples the
process's resident set every few milliseconds. Each phase gets its wall seconds and the
highest RSS seen while it was the innermost phase; the run's peak RSS is attributed to the
phase it happened in (results/gptq_phase_split.{json,md}).

The markers wrap qcal's functions from outside (this study only; the library knows nothing
of them), so the run is the command a user types.

    python -m qcal.studies.phase_split [--model qwen2.5-coder-1.5b] [--layers 2]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qcal.model.loading import resolve_model_dir
from qcal.paths import results_dir, runs_dir
from qcal.results import provenance, provenance_markdown, write_results
from qcal.studies.tables import shown
from qcal.studies.truncate import truncate_model

PAGE = os.sysconf("SC_PAGE_SIZE")
GIB = 2**30
FLAGS = ["--method", "gptq", "--desc-act", "--bits", "4", "--group-size", "128", "--calib",
         "debian-handbook", "--nsamples", "32", "--seqlen", "512", "--seed", "0"]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PhaseMeter:
    """A stack of named phases and, per phase, wall seconds and the highest RSS sampled."""

    def __init__(self, interval: float = 0.005,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.stack = ["other (start-up, calibration data, side files)"]
        self.seconds: dict[str, float] = {}
        self.peak: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.top = (0, "")
        self._interval = interval
        self._stop = threading.Event()
        self._clock = clock
        self._since = clock()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.note()

    def note(self) -> None:
        rss, phase = _rss(), self.stack[-1]
        if rss > self.peak.get(phase, 0):
            self.peak[phase] = rss
        if rss > self.top[0]:
            self.top = (rss, phase)

    def _switch(self) -> None:
        now = self._clock()
        phase = self.stack[-1]
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._since
        self._since = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.note()
        self._switch()
        self.stack.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            yield
        finally:
            self.note()
            self._switch()
            self.stack.pop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.note()
        self._switch()


def _wrap(meter: PhaseMeter, owner: Any, attr: str, label: Callable[..., str]) -> None:
    original = getattr(owner, attr)

    @functools.wraps(original)
    def marked(*args: Any, **kwargs: Any) -> Any:
        with meter.phase(label(*args, **kwargs)):
            return original(*args, **kwargs)

    setattr(owner, attr, marked)


def _step_label(layer: Any, inputs: Any, step: tuple[str, ...], *_: Any, **__: Any) -> str:
    return "calibration pass + Hessians: " + "/".join(n.rsplit(".", 1)[-1] for n in step)


def _solve_label(weight: Any, *_: Any, **__: Any) -> str:
    return f"GPTQ column loop (in {weight.shape[1]})"


def _cholesky_label(hessian: Any, *_: Any, **__: Any) -> str:
    return f"inverse Cholesky (in {hessian.shape[0]})"


def instrument(meter: PhaseMeter) -> None:
    """Mark qcal's GPTQ phases (the names the modules look them up by at call time)."""
    from qcal import run
    from qcal.methods import gptq_runner
    from qcal.model import offload, sequential, stream
    from qcal.quant import gptq

    _wrap(meter, stream, "build_skeleton", lambda *a, **k: "model skeleton (embedding, norms)")
    _wrap(meter, run, "save_streamed_checkpoint", lambda *a, **k: "export (checkpoint shards)")
    _wrap(meter, sequential, "capture_layer0_inputs", lambda *a, **k: "layer-0 capture")
    _wrap(meter, sequential, "run_layer", lambda *a, **k: "final pass (next layer's inputs)")
    _wrap(meter, offload.DiskWeights, "load_into", lambda *a, **k: "read layer weights")
    _wrap(meter, gptq_runner, "feed_linear_inputs", _step_label)
    _wrap(meter, gptq_runner, "gptq_quantize", lambda *a, **k: "GPTQ solve")
    _wrap(meter, gptq, "_gptq", _solve_label)
    _wrap(meter, gptq, "inverse_cholesky", _cholesky_label)
    _wrap(meter, gptq_runner, "apply_result", lambda *a, **k: "pack + swap in QuantLinear")
    _wrap(meter, gptq_runner, "hessian_loss", lambda *a, **k: "Hessian loss")


def memory_goal(model_dir: Path, nsamples: int, seqlen: int) -> dict[str, float]:
    """Issue 47's bound: 2 x the bf16 size of one decoder layer + the calibration
    activations (float32 inputs and outputs of a layer) + 1.5 GiB, from the files' headers."""
    from qcal.tensor_files import index_file

    config = json.loads((model_dir / "config.json").read_text())
    layer0 = [t for f in sorted(model_dir.glob("*.safetensors"))
              for k, t in index_file(f).items() if ".layers.0." in k]
    params = sum(math.prod(t.shape) for t in layer0)
    activations = 2 * nsamples * seqlen * int(config["hidden_size"]) * 4
    return {"layer_params": params, "layer_bf16_gib": 2 * params / GIB,
            "activations_gib": activations / GIB,
            "goal_gib": (2 * 2 * params + activations) / GIB + 1.5}


def _goal_lines(data: dict[str, Any]) -> list[str]:
    goal = data.get("memory_goal")
    if not goal:
        return []
    inside = max((r for r in data["phases"] if not r["phase"].startswith(("other", "model",
                                                                           "export"))),
                 key=lambda r: r["peak_rss_gib"])
    verdict = "met" if data["peak_rss_gib"] <= goal["goal_gib"] else "NOT met"
    return ["## The memory goal of issue 47", "",
            f"Goal: peak RSS <= 2 x the bf16 size of one decoder layer "
            f"({goal['layer_params'] / 1e6:.1f}M parameters: 2 x {goal['layer_bf16_gib']:.3f} GiB)"
            f" + the calibration activations (a layer's float32 inputs and outputs: "
            f"{goal['activations_gib']:.3f} GiB) + 1.5 GiB = {goal['goal_gib']:.2f} GiB.", "",
            f"- Process peak {data['peak_rss_gib']:.2f} GiB ({data['peak_phase']}): {verdict}.",
            f"- Highest inside quantization: {inside['peak_rss_gib']:.2f} GiB, in "
            f"{inside['phase']}.", ""]


def render(data: dict[str, Any]) -> str:
    rows = sorted(data["phases"], key=lambda r: -r["seconds"])
    lines = [f"# Where qcal GPTQ's time and memory go ({data['scope']})", "",
             f"Peak RSS {data['peak_rss_gib']:.3f} GiB, during: {data['peak_phase']}. "
             f"RSS after imports, before the model: {data['baseline_rss_gib']:.3f} GiB. "
             f"Wall {data['wall_seconds']:.1f} s, of which quantize {data['quantize_seconds']:.1f} s.",
             "", "| phase (innermost) | calls | wall s | share of wall | peak RSS GiB in it |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['calls']} | {r['seconds']:.1f} | "
                     f"{100 * r['seconds'] / data['wall_seconds']:.1f}% | {r['peak_rss_gib']:.3f} |")
    lines += ["", "Wall seconds of a phase exclude the phases nested in it (the GPTQ solve's "
              "inverse Cholesky and column loop are their own rows). RSS is sampled every 5 ms "
              "from /proc/self/statm, so a spike shorter than that can be missed.", "",
              *_goal_lines(data), *data.get("notes", []), ""]
    return "\n".join(lines) + provenance_markdown(data["provenance"])


def render_study(grids: list[Path], out: Path | None = None) -> None:
    from qcal.studies.peers_report import rerender_json

    rerender_json("gptq-phase-split", grids, out, render)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--layers", type=int, default=2, help="first N layers (0: the whole model)")
    p.add_argument("--out", type=Path, default=None, help="results stem")
    args = p.parse_args(argv)
    from qcal.cli import main as qcal_main

    baseline = _rss()
    model = resolve_model_dir(args.model)
    work = runs_dir() / "phase_split" / model.name
    target = model
    if args.layers:
        target = work / f"L{args.layers}"
        if not (target / "TRUNCATED.json").is_file():
            truncate_model(model, args.layers, target)
    meter = PhaseMeter()
    instrument(meter)
    meter.start()
    begin = time.perf_counter()
    code = qcal_main(["quantize", "--model", str(target), *FLAGS, "-o", str(work / "ckpt"),
                      "--overwrite"])
    wall = time.perf_counter() - begin
    meter.stop()
    if code:
        raise SystemExit(f"qcal quantize exited {code}")
    log = json.loads((work / "ckpt" / "quant_log.json").read_text())
    scope = (f"{model.name}, first {args.layers} layers" if args.layers else model.name)
    phases = [{"phase": k, "calls": meter.calls.get(k, 1), "seconds": round(v, 3),
               "peak_rss_gib": round(meter.peak.get(k, 0) / GIB, 4)}
              for k, v in meter.seconds.items()]
    command = " ".join(["python -m qcal.studies.phase_split",
                        *(argv if argv is not None else sys.argv[1:])])
    data = {"scope": scope, "flags": FLAGS, "phases": phases, "wall_seconds": round(wall, 2),
            "quantize_seconds": log["quantize_seconds"],
            "peak_rss_gib": round(meter.top[0] / GIB, 4), "peak_phase": meter.top[1],
            "baseline_rss_gib": round(baseline / GIB, 4),
            "memory_goal": memory_goal(target, int(FLAGS[FLAGS.index("--nsamples") + 1]),
                                       int(FLAGS[FLAGS.index("--seqlen") + 1])),
            "provenance": provenance(command=command, model=shown(target, Path.cwd()))}
    out = args.out or results_dir() / "gptq_phase_split"
    write_results(out, data, render(data))
    print(f"wrote {out}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
