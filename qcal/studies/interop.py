"""Measurements of the interoperability study (scripts/interop_matrix.py): the logits a
loader gives for a checkpoint, lm-eval's CLI on it, and how far two sets of logits agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from qcal.model.loading import load_model
from qcal.paths import qcal_home
from qcal.studies.peers import peer_venv


def logits_of(loader: str, path: Path, windows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Logits of `windows` as `loader` (qcal, bare transformers, or GPTQModel in its venv)
    loads the checkpoint at `path`."""
    if loader.startswith("GPTQModel"):
        import tempfile

        from safetensors.torch import load_file, save_file

        with tempfile.TemporaryDirectory() as tmp:
            save_file({"ids": windows.contiguous()}, f"{tmp}/ids.safetensors")
            peer = peer_venv() / "bin" / "python"
            script = qcal_home() / "tests" / "integration" / "peer" / "gptqmodel_logits.py"
            run = subprocess.run([str(peer), str(script), str(path), f"{tmp}/ids.safetensors",
                                  f"{tmp}/out.safetensors"], capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(run.stderr.strip().splitlines()[-1])
            return load_file(f"{tmp}/out.safetensors")["logits"]
    if loader == "qcal":
        net = load_model(path, dtype=dtype)[0]
    else:  # bare: no argument besides the dtype of the comparison
        from transformers import AutoModelForCausalLM

        net = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    with torch.no_grad():
        return net(windows).logits.float()


def lm_eval_cli(path: Path, work: Path) -> dict[str, Any]:
    """`lm_eval --model hf --model_args pretrained=<path>` on 5 items of a packaged task."""
    from qcal.eval.local_tasks import tasks_dir

    out = work / f"lm_eval-{path.name}"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={path},dtype=float32", "--tasks", "qcal_nextsent_en", "--include_path",
           str(tasks_dir()), "--limit", "5", "--device", "cpu", "--batch_size", "1",
           "--output_path", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    results = sorted(out.rglob("results_*.json")) if out.is_dir() else []
    if run.returncode != 0 or not results:
        lines = [ln for ln in run.stderr.strip().splitlines() if "Error" in ln] or ["no result"]
        raise RuntimeError(lines[-1])
    acc = json.loads(results[-1].read_text())["results"]["qcal_nextsent_en"]["acc,none"]
    return {"lm_eval_acc_5_items": acc}


def agreement(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """Largest |difference| relative to the largest |logit|, and the top-1 agreement."""
    return {"max_rel_diff": float((ref - got).abs().max() / ref.abs().max()),
            "top1_agree": float((ref.argmax(-1) == got.argmax(-1)).float().mean())}
