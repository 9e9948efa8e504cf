"""`--rotate hadamard`: on every tiny family it either leaves the float logits unchanged
(relative change < 1e-4) or is refused in one line, naming what is not exact; a tied head
is untied and the checkpoint loads in bare transformers with qcal's logits; the CLI refuses
an unrotatable model before anything is written; an 8-bit rotated RTN model stays at float
quality; the recipe key changes only when a rotation is asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import QuantScheme, RTNConfig
from qcal.errors import ConfigError
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.model.rotate import TOLERANCE, check_rotatable, rotate_model
from qcal.model.tiny import TINY_FAMILIES, build_tiny_family
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.recipe import QuantRecipe
from qcal.run_config import Rotation

pytestmark = pytest.mark.integration
PROBE = torch.arange(1, 41).view(2, 20)
EXACT = {"llama", "mistral", "qwen2", "qwen3", "phi3", "granite"}
REFUSED = {  # family -> what the one line names
    "gemma2": "post-norms", "gemma3": "post-norms", "olmo2": "post-norms",
    "phi": "RMSNorm", "opt": "RMSNorm", "gpt_neox": "RMSNorm", "falcon": "RMSNorm",
    "stablelm": "RMSNorm", "gpt2": "re-expressed", "mixtral": "MoE", "qwen3_moe": "MoE",
}


def test_every_family_is_exact_or_refused() -> None:
    assert EXACT | set(REFUSED) == set(TINY_FAMILIES)


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_family(family: str, tmp_path: Path) -> None:
    net, _, _ = load_model(build_tiny_family(family, tmp_path / family))
    if family in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[family]) as err:
            check_rotatable(net, arch_for(net))
        assert "\n" not in str(err.value) and "drop --rotate" in str(err.value)
        return
    with torch.no_grad():
        before = net(PROBE).logits
    record = rotate_model(net, arch_for(net), seed=3, probe=PROBE)
    with torch.no_grad():
        after = net(PROBE).logits
    assert record["probe_relative_change"] < TOLERANCE
    assert float((after - before).norm() / before.norm()) < TOLERANCE
    layer0 = dict(net.named_parameters())
    # The rotation really happened: the embedding's channels are mixed, norms are 1.
    assert not torch.allclose(net.get_input_embeddings().weight[:, :4], torch.zeros(1))
    assert all(bool((p == 1).all()) for n, p in layer0.items() if n.endswith("input_layernorm.weight"))


def test_tied_head_is_untied_and_loads_in_bare_transformers(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "rot"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "rtn", "--bits", "8",
                 "--group-size", "32", "--rotate", "hadamard:2", "--device", "cpu",
                 "-o", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    log = json.loads((out / "quant_log.json").read_text())
    assert config["tie_word_embeddings"] is False and log["rotation"]["untied_head"] is True
    assert log["recipe"]["rotation"] == {"kind": "hadamard", "seed": 2}
    assert "Rotated before quantizing" in (out / "README.md").read_text()
    bare = AutoModelForCausalLM.from_pretrained(out).eval()
    ours = load_checkpoint(out)
    float_net, _, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        a, b, f = bare(PROBE).logits, ours(PROBE).logits, float_net(PROBE).logits
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # 8 bits on the rotated weights: close to the float model, as without rotation.
    assert float((a - f).norm() / f.norm()) < 0.02


def test_unrotatable_model_is_refused_before_any_output(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    model = build_tiny_family("gemma3", tmp_path / "gemma3")
    capsys.readouterr()  # the builder's progress bars
    out = tmp_path / "never"
    assert main(["quantize", "--model", str(model), "--method", "rtn", "--group-size", "32",
                 "--rotate", "hadamard",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "post-norms" in err[0] and not out.exists()
    assert main(["quantize", "--model", str(model), "--rotate", "spin", "-o", str(out)]) == 2
    assert "--rotate" in capsys.readouterr().err and not out.exists()


def test_recipe_key_and_round_trip(tiny_model_dir: Path) -> None:
    plain = QuantRecipe(method=RTNConfig(QuantScheme(4, 32)), calib=None)
    rotated = QuantRecipe(method=RTNConfig(QuantScheme(4, 32)), calib=None,
                          rotation=Rotation(seed=1))
    other = QuantRecipe(method=RTNConfig(QuantScheme(4, 32)), calib=None,
                        rotation=Rotation(seed=2))
    keys = {r.checkpoint_key(tiny_model_dir) for r in (plain, rotated, other)}
    assert len(keys) == 3
    assert "rotation" not in plain.to_dict()
    assert QuantRecipe.from_dict(rotated.to_dict()) == rotated


@pytest.mark.parametrize("method", ["gptq", "awq", "gptaq"])
def test_calibrated_methods_run_on_the_rotated_model(method: str, tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    """The methods see the rotated float model (loaded whole: its layers differ from the
    files, so nothing is re-read from them) and the result loads back."""
    from qcal.model.tiny import stdlib_text

    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()))
    out = tmp_path / method
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", method, "--bits", "8",
                 "--group-size", "32", "--rotate", "hadamard", "--calib", str(text),
                 "--nsamples", "4", "--seqlen", "32", "--device", "cpu", "-o", str(out)]) == 0
    float_net, _, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        got, want = load_checkpoint(out)(PROBE).logits, float_net(PROBE).logits
    assert float((got - want).norm() / want.norm()) < 0.02


def test_a_grid_takes_rotation_as_an_axis(tiny_model_dir: Path, tmp_path: Path) -> None:
    from grid_cases import spec_for, write_grid_texts

    from qcal.grid import GridRunner, plan_cells

    texts = write_grid_texts(tmp_path)
    spec = spec_for(tiny_model_dir, texts, methods=("rtn",), selectors=("random",),
                    rotate=[None, "hadamard:1"])
    keys = sorted(c.key for c in plan_cells(spec))
    assert keys == ["float", "none__rtn__norot", "none__rtn__rot-hadamard-1"]
    cells = GridRunner(spec, tmp_path / "res", tmp_path / "work", progress=False).run()
    rotated = cells["none__rtn__rot-hadamard-1"]
    assert rotated["recipe_key"] != cells["none__rtn__norot"]["recipe_key"]
    assert spec.recipe(plan_cells(spec)[2], tmp_path / "o").rotation == Rotation(seed=1)
