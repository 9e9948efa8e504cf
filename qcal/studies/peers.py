"""The peers' side of a comparison (scripts/bench_peers.py, scripts/bench_big_model.py):
each peer in its own pinned virtualenv under runs/ (built on demand, never a qcal
dependency), `peer_worker.py` run inside it (it imports no qcal), version probes, and qcal's
own quantize runs and scores of the same steps. Paths are the checkout's (`qcal_home()`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from qcal.cli import command_prefix
from qcal.eval.perplexity import perplexity_of_ids
from qcal.model.loading import load_model
from qcal.paths import qcal_home, runs_dir
from qcal.studies.bench import timed

WORKER = Path(__file__).with_name("peer_worker.py")
# How a peer's python runs the worker: -P keeps the worker's own folder off sys.path, where
# this package's modules (kernels.py, ...) would shadow packages the peers import.
WORKER_ARGS = ("-P", str(WORKER))


def peer_venv() -> Path:
    """GPTQModel's virtualenv (scripts/setup_peer_venv.sh)."""
    return runs_dir() / "peer-venv"


# The last commit before the AWQ speed work (Gram loss for lone linears, token budget).
BASELINE_REV = "4112516"
AUTOAWQ_PINS = ["torch==2.13.0", "transformers==4.51.3", "autoawq==0.2.9"]
LLMCOMPRESSOR_PINS = ["torch==2.13.0", "llmcompressor==0.14.0.1"]
LLMCOMPRESSOR_PROBE = ("import llmcompressor, compressed_tensors, transformers; print("
                       "'llm-compressor', llmcompressor.__version__, 'compressed-tensors', "
                       "compressed_tensors.__version__, 'transformers', transformers.__version__)")
GPTQMODEL_PROBE = ("import gptqmodel, optimum.version as o, torch, transformers; "
                   "print(f'gptqmodel {gptqmodel.__version__}, optimum {o.__version__}, "
                   "torch {torch.__version__}, transformers {transformers.__version__}')")
AUTOAWQ_PROBE = ("import awq, transformers; print('AutoAWQ', awq.__version__, 'transformers', "
                 "transformers.__version__)")


def _ensure_venv(venv: Path, module: str, pins: list[str]) -> Path:
    """A peer's own virtualenv with `pins` installed (built when `module` does not import)."""
    python = venv / "bin" / "python"
    if not (python.exists() and subprocess.run([str(python), "-c", f"import {module}"], cwd="/",
                                               capture_output=True).returncode == 0):
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *pins], check=True)
    return python


def ensure_autoawq(venv: Path) -> Path:
    return _ensure_venv(venv, "awq", AUTOAWQ_PINS)


def ensure_llmcompressor(venv: Path) -> Path:
    return _ensure_venv(venv, "llmcompressor", LLMCOMPRESSOR_PINS)


def ensure_gptqmodel(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", str(qcal_home() / "scripts" / "setup_peer_venv.sh")], check=True,
                       env={**os.environ, "PEER_VENV": str(venv)})
    return python


def baseline_source(rev: str, dest: Path) -> Path:
    """qcal's package as it was at `rev` (git archive), unpacked under `dest`."""
    if not (dest / "qcal" / "__init__.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(qcal_home()), "archive", rev, "qcal"],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def peer_version(python: Path | None, probe: str, what: str) -> str:
    if python is None:
        return f"{what}: not run now"
    # cwd="/": `-c` puts the working directory on sys.path, and a checkout's kernels/ folder
    # would shadow the `kernels` package the peers' transformers imports.
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    # Peers print banners on import; the probe's own line is the last one.
    lines = (out.stdout if out.returncode == 0 else out.stderr).strip().splitlines()
    return lines[-1][:300] if lines else f"probe exited {out.returncode}"


def peer_run(python: Path, cmd: list[str], result: Path, env: dict[str, str] | None = None
             ) -> dict[str, Any]:
    # No PYTHONPATH: a checkout on it would put its kernels/ folder where the peer's
    # transformers looks for the `kernels` package (and qcal where the peer needs none).
    run = timed([str(python), *WORKER_ARGS, *cmd], env={**(env or {}), "PYTHONPATH": ""},
                cwd=qcal_home())
    if run["returncode"] == 0:
        run.update(json.loads(result.read_text()))
    return run


def qcal_run(out: Path, args: list[str], expected_digest: str | None,
             pythonpath: Path | None = None) -> dict[str, Any]:
    """`qcal quantize ARGS -o OUT` under time -v, with its quantize time and calibration
    digest; `pythonpath`: an earlier commit's package, run from its unpacked source."""
    cmd = [*command_prefix(), "quantize", *args, "-o", str(out)]
    env, cwd = None, qcal_home()
    if pythonpath is not None:
        # `-m` puts the working directory first on sys.path; QCAL_HOME finds the models.
        cmd = [sys.executable, "-m", "qcal", *cmd[len(command_prefix()):]]
        env, cwd = {"QCAL_HOME": str(qcal_home())}, pythonpath
    run = timed(cmd, env=env, cwd=cwd)
    where = subprocess.run([sys.executable, "-c", "import qcal; print(qcal.__file__)"],
                           capture_output=True, text=True, cwd=cwd,
                           env={**os.environ, **(env or {})})
    run["qcal_package"] = where.stdout.strip()  # proves which code ran
    if run["returncode"] == 0:
        log = json.loads((out / "quant_log.json").read_text())
        run["quantize_seconds"] = log["quantize_seconds"]
        digest = (log.get("calibration") or {}).get("digest")
        run["calibration_digest"] = digest
        run["same_calibration"] = digest == expected_digest if expected_digest else None
    return run


def qcal_ppl(path: Path, windows: Any, fail_soft: bool = False) -> dict[str, Any]:
    try:
        net, _, _ = load_model(path)
    except Exception as err:  # noqa: BLE001 - with fail_soft the failure is the result
        if not fail_soft:
            raise
        return {"error": f"{type(err).__name__}: {err}"}
    res = perplexity_of_ids(net, windows.reshape(-1), windows.shape[1], None, 4, None,
                            progress=True, desc=f"ppl[{path.name}]")
    return {"ppl": res.ppl, "tokens": res.tokens}
