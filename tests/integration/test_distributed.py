"""Data-parallel calibration under torchrun (gloo on CPU): two processes give the
checkpoint one process gives, up to the summation order of the Hessians."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from qcal.cli import command_prefix
from qcal.model.distributed import DistContext
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration


def test_owners_balance_the_work() -> None:
    ctx = DistContext(rank=0, world=2)
    sizes = [576**2, 576**2, 576**2, 1536**2]
    owners = ctx.owners(sizes)
    load = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r) for r in range(2)]
    assert owners[3] != owners[0] or owners[3] != owners[1]  # the big one is not doubled up
    assert max(load) == 1536**2  # the big one alone; the three small ones on the other rank
    assert DistContext().owners([5, 7]) == [0, 0]
    assert torch.equal(ctx.shard(torch.arange(6)), torch.tensor([0, 2, 4]))


def _quantize(model: Path, text: Path, out: Path, method: str, *extra: str
              ) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command_prefix(), "quantize", "--model", str(model), "--method",
                           method, "--calib", str(text), "--nsamples", "8", "--seqlen", "64",
                           "-o", str(out), *extra], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize(("method", "min_same", "max_ppl_change"), [
    ("gptq", 0.85, 0.01),  # the same Hessians up to float32 summation order
    # AWQ: statistics, block losses and clip errors are sums over every token (the clip
    # sample covers all 512 tokens here), so only float rounding can differ.
    ("awq", 0.97, 0.001),
])
def test_two_processes_match_one(method: str, min_same: float, max_ppl_change: float,
                                 tiny_model_dir: Path, tmp_path: Path) -> None:
    from qcal.eval.job import run_evaluation
    from qcal.packing.checkpoint import quant_modules
    from qcal.packing.checkpoint_load import load_checkpoint
    from qcal.packing.formats import codes_of
    from qcal.run_config import EvalConfig

    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:80]), encoding="utf-8")
    one = _quantize(tiny_model_dir, text, tmp_path / "one", method)
    two = _quantize(tiny_model_dir, text, tmp_path / "two", method, "--nproc", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "two")
    same = total = 0
    for name, layer in quant_modules(a).items():
        ca, cb = codes_of(layer).codes, codes_of(quant_modules(b)[name]).codes
        same += int((ca == cb).sum())
        total += ca.numel()
    print(f"{method}: identical codes {same / total:.4f}")
    assert same / total > min_same

    def ppl(ckpt: Path) -> float:
        out = run_evaluation(ckpt, EvalConfig(seqlen=64, max_windows=20), text_file=text,
                             progress=False, device="cpu")
        return out.data["perplexity"]["model"]["file"]["ppl"]

    assert abs(ppl(tmp_path / "two") / ppl(tmp_path / "one") - 1) < max_ppl_change
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("two")) == ["two"]
    if method == "awq":  # rank 0 wrote the replayable search artifact
        assert (tmp_path / "two" / "artifacts" / "awq_search.safetensors").is_file()
