"""The loader matrix: format x symmetric/asymmetric x act-order x loader.

Every format loads back in qcal with every code intact. The default format
(compressed-tensors) also loads in bare `AutoModelForCausalLM.from_pretrained(path)` with
no extra argument and in `lm_eval --model hf` (its CLI, in a subprocess), both computing
qcal's logits. scripts/interop_matrix.py runs the same matrix into results/interop.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qcal.config import GPTQConfig, QuantScheme
from qcal.errors import ConfigError
from qcal.methods import METHODS, RunOptions
from qcal.model.loading import load_model
from qcal.packing.checkpoint import DEFAULT_FORMAT, FORMATS, save_checkpoint
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.recipe import QuantRecipe, fit_to_format

pytestmark = pytest.mark.integration
PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300]])
CASES = [(sym, act) for sym in (False, True) for act in (False, True)]


def _case_id(sym: bool, act: bool) -> str:
    return f"{'sym' if sym else 'asym'}-{'actorder' if act else 'plain'}"


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(fmt, sym, act) -> (checkpoint dir, qcal's logits), for every storable combination;
    the method config of each comes from the recipe's own format rule (fit_to_format)."""
    root = tmp_path_factory.mktemp("interop")
    calib = torch.randint(0, 400, (4, 32), generator=torch.Generator().manual_seed(0))
    made: dict[tuple[str, bool, bool], tuple[Path, torch.Tensor]] = {}
    for sym, act in CASES:
        for fmt in FORMATS:
            cfg, _ = fit_to_format(GPTQConfig(QuantScheme(4, 32, sym=sym), desc_act=act), fmt)
            net, tok, _ = load_model(tiny_model_dir)
            METHODS.get("gptq").run(net, cfg, calib, RunOptions(progress=False))
            out = root / f"{fmt}-{_case_id(sym, act)}"
            save_checkpoint(net, out, tok, sym=sym, fmt=fmt,
                            fields=METHODS.get("gptq").checkpoint_fields(cfg))
            with torch.no_grad():
                made[fmt, sym, act] = out, net(PROMPTS).logits
    return made


def test_the_default_format_is_compressed_tensors() -> None:
    assert DEFAULT_FORMAT == "compressed-tensors" and QuantRecipe().format == DEFAULT_FORMAT


def test_formats_without_g_idx_take_act_order_with_static_groups() -> None:
    for fmt in ("compressed-tensors", "awq"):
        recipe = QuantRecipe(method=GPTQConfig(desc_act=True), format=fmt)
        assert recipe.method.static_groups and "static groups" in recipe.notes[-1]
    assert not QuantRecipe(method=GPTQConfig(desc_act=True), format="gptq").method.static_groups
    with pytest.raises(ConfigError, match="--format awq holds 4-bit weights, not 8-bit"):
        QuantRecipe(method=GPTQConfig(QuantScheme(8, 32)), format="awq")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("sym", "act"), CASES, ids=[_case_id(*c) for c in CASES])
def test_qcal_loads_every_format(checkpoints, fmt: str, sym: bool, act: bool) -> None:
    path, logits = checkpoints[fmt, sym, act]
    with torch.no_grad():
        torch.testing.assert_close(load_checkpoint(path)(PROMPTS).logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize(("sym", "act"), CASES, ids=[_case_id(*c) for c in CASES])
def test_bare_transformers_loads_the_default_format(checkpoints, sym: bool, act: bool) -> None:
    from transformers import AutoModelForCausalLM

    path, logits = checkpoints[DEFAULT_FORMAT, sym, act]
    weights = json.loads((path / "config.json").read_text())["quantization_config"][
        "config_groups"]["group_0"]["weights"]
    assert weights.get("actorder") == ("weight" if act else None)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(PROMPTS).logits
    assert float((theirs - logits).abs().max() / logits.abs().max()) < 1e-4
    assert torch.equal(theirs.argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize(("sym", "act"), CASES, ids=[_case_id(*c) for c in CASES])
def test_lm_eval_cli_loads_the_default_format(checkpoints, tmp_path: Path, sym: bool,
                                              act: bool) -> None:
    from qcal.eval.local_tasks import tasks_dir

    path, _ = checkpoints[DEFAULT_FORMAT, sym, act]
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={path},dtype=float32", "--tasks", "qcal_nextsent_en", "--include_path",
           str(tasks_dir()), "--limit", "5", "--device", "cpu", "--batch_size", "1",
           "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert len(results) == 1, run.stdout[-1000:]
    task = json.loads(results[0].read_text())["results"]["qcal_nextsent_en"]
    assert 0.0 <= task["acc,none"] <= 1.0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != DEFAULT_FORMAT])
def test_the_cards_recipe_for_other_formats_loads_in_bare_transformers(
        checkpoints, tmp_path: Path, fmt: str) -> None:
    """The model card of a non-default format says: convert with `qcal export`; that works."""
    from transformers import AutoModelForCausalLM

    from qcal.cli import main
    from qcal.packing.card import model_card

    card = model_card({"method": "gptq", "config": {}}, fmt, "org/name")
    assert "qcal export --model <this folder> --format compressed-tensors -o <new dir>" in card
    path, logits = checkpoints[fmt, False, True]
    if fmt != "awq":  # act-order groups in g_idx: refused in one line, as the card says
        assert main(["export", "--model", str(path), "--format", DEFAULT_FORMAT,
                     "-o", str(tmp_path / "x")]) == 2
        assert "has no compressed-tensors form" in card and not (tmp_path / "x").exists()
        path, logits = checkpoints[fmt, False, False]
    assert main(["export", "--model", str(path), "--format", DEFAULT_FORMAT,
                 "-o", str(tmp_path / "ct")]) == 0
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ct"), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(PROMPTS).logits
    assert float((theirs - logits).abs().max() / logits.abs().max()) < 1e-4


@pytest.mark.parametrize("sym", [True, False])
def test_per_module_schemes_are_config_groups_that_loaders_honour(tiny_model_dir: Path,
                                                                  tmp_path: Path, sym: bool) -> None:
    """Linears of two widths (what --scheme-override makes): one config group per scheme,
    targeting its linears; qcal reads each linear at its own width, and so does bare
    transformers for symmetric schemes. Asymmetric mixed widths: transformers 5.24's
    load-time dequantization has one scheme for all dense linears, so the file does not ask
    for it and transformers refuses it loudly rather than loading wrong weights."""
    from transformers import AutoModelForCausalLM

    from qcal.config import RTNConfig
    from qcal.errors import CheckpointError
    from qcal.module_tree import get_module, set_module
    from qcal.packing.checkpoint import quant_modules

    nets = {}
    for bits in (4, 8):
        nets[bits], tok, _ = load_model(tiny_model_dir)
        METHODS.get("rtn").run(nets[bits], RTNConfig(QuantScheme(bits, 32, sym=sym)), None,
                               RunOptions(progress=False))
    net = nets[4]
    wide = [n for n in quant_modules(net) if n.endswith("down_proj")]
    for name in wide:
        set_module(net, name, get_module(nets[8], name))
    save_checkpoint(net, tmp_path / "ct", tok, sym=sym, fmt="compressed-tensors")
    qcfg = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    groups = qcfg["config_groups"]
    assert "dequantize" not in qcfg
    by_bits = {g["weights"]["num_bits"]: sorted(g["targets"]) for g in groups.values()}
    # Targets are `re:` patterns, one per kind of linear, since every layer's down_proj is wide.
    assert by_bits[8] == [r"re:model\.layers\.\d+\.mlp\.down_proj$"] and len(wide) == 2
    assert len(by_bits[4]) == 6 and all(t.startswith("re:model\\.layers\\.\\d+") for t in by_bits[4])
    back = load_checkpoint(tmp_path / "ct")
    assert {n: q.bits for n, q in quant_modules(back).items()} == {
        n: q.bits for n, q in quant_modules(net).items()}
    with torch.no_grad():
        ours = net(PROMPTS).logits
        torch.testing.assert_close(back(PROMPTS).logits, ours, rtol=0, atol=0)
        if not sym:
            with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
                AutoModelForCausalLM.from_pretrained(str(tmp_path / "ct"), dtype=torch.float32)
        else:
            theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ct"),
                                                          dtype=torch.float32)(PROMPTS).logits
            assert float((theirs - ours).abs().max() / ours.abs().max()) < 1e-4
    with pytest.raises(CheckpointError, match="AWQ GEMM layout holds one scheme"):
        save_checkpoint(net, tmp_path / "awq", tok, sym=sym, fmt="awq")
    with pytest.raises(CheckpointError, match="gptq quantization_config holds one scheme"):
        save_checkpoint(net, tmp_path / "gptq", tok, sym=sym, fmt="gptq")
