"""A non-editable install runs from any directory and writes only where it is told:
models/runs/results default to the current directory (or $QCAL_HOME), never into the
installed package; the kernels install as `qcal_kernels`, not as a top-level `kernels`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    target = tmp_path_factory.mktemp("site")
    # Build from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds.
    src = tmp_path_factory.mktemp("src") / "qcal"
    top_level = {".git", ".venv", "runs", "data", "models", "results", "build"}

    def skip(folder: str, names: list[str]) -> list[str]:
        drop = top_level if Path(folder) == ROOT else set()
        return [n for n in names if n in drop or n.endswith(".egg-info") or n == "__pycache__"]

    shutil.copytree(ROOT, src, ignore=skip)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-compile", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=600)
    if build.returncode != 0:
        pytest.fail(f"pip install . failed:\n{build.stderr[-2000:]}")
    return target


def test_installed_package_runs_elsewhere_and_writes_only_there(installed: Path, tmp_path: Path,
                                                                 tiny_model_dir: Path) -> None:
    assert (installed / "qcal_kernels" / "dispatch.py").is_file()
    assert not (installed / "kernels").exists()
    assert (installed / "qcal" / "eval" / "tasks" / "qcal_nextsent_en.yaml").is_file()
    before = _files(installed)
    home = tmp_path / "work"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QCAL_")}
    env["PYTHONPATH"] = str(installed)
    text = home / "calib.txt"
    text.write_text("\n\n".join(["Plain text for calibration and evaluation. " * 40] * 8))

    def qcal(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "qcal", *args], cwd=home, env=env,
                              capture_output=True, text=True, timeout=600)

    where = subprocess.run([sys.executable, "-c", "import qcal, qcal_kernels; "
                            "print(qcal.__file__); print(qcal_kernels.__file__)"],
                           cwd=home, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(installed)) for line in where.stdout.split()), where.stdout
    done = qcal("quantize", "--model", str(tiny_model_dir), "--method", "gptq", "--group-size",
                "32", "--calib", str(text), "--nsamples", "4", "--seqlen", "32", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    ckpt = home / "runs" / f"{tiny_model_dir.name}-gptq-w4g32"
    assert (ckpt / "quant_log.json").is_file()  # under the current directory
    evaluated = qcal("eval", "--model", str(ckpt), "--text", str(text), "--seqlen", "32",
                     "-o", "results/tiny")
    assert evaluated.returncode == 0, evaluated.stderr
    assert (home / "results" / "tiny.json").is_file()
    missing = qcal("quantize")  # no default model in this directory: a pointer, not a crash
    assert missing.returncode == 2 and "make setup" in missing.stderr
    assert _files(installed) == before, "qcal wrote into its installed package"
