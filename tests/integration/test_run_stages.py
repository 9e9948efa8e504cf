"""`qcal.run.run_recipe` is one line of stages that each call down once: per run the stages
build the model's meta skeleton once, read its tokenizer once, load its weights once and
calibrate once; `qcal quantize` and `qcal.quantize` both drive that line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration


def _count(monkeypatch: pytest.MonkeyPatch, name: str, *modules: Any) -> list[tuple[Any, ...]]:
    """Calls of function `name` through any of `modules` (where it is defined and where it is
    imported), counted together."""
    calls: list[tuple[Any, ...]] = []
    for module in modules:
        real = getattr(module, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(args)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture()
def calib_text(tmp_path: Path) -> Path:
    path = tmp_path / "calib.txt"
    path.write_text("\n\n".join(stdlib_text()[:60]), encoding="utf-8")
    return path


def test_each_stage_calls_down_once(tiny_model_dir: Path, calib_text: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal import run
    from qcal.config import GPTQConfig, ModuleSelection, QuantScheme, parse_scheme_override
    from qcal.model import loading
    from qcal.output import OutputPolicy
    from qcal.recipe import QuantRecipe
    from qcal.run_config import CalibConfig

    # load_model's own file check compares the files with a pristine skeleton of its own
    # (qcal.model.consistency); the stages share one, adapted in place by arch_for.
    skeletons = _count(monkeypatch, "skeleton", run)
    tokenizers = _count(monkeypatch, "load_tokenizer", run, loading)  # load_model's own too
    loads = _count(monkeypatch, "load_model", run, loading)
    calibrations = _count(monkeypatch, "calibrate", run)
    # A per-module scheme makes the resolve stage read the skeleton too: it is still built once.
    recipe = QuantRecipe(method=GPTQConfig(scheme=QuantScheme(4, 32)), model=str(tiny_model_dir),
                         calib=CalibConfig(source=str(calib_text), nsamples=2, seqlen=32),
                         output=str(tmp_path / "out"), device="cpu",
                         modules=ModuleSelection(schemes=(
                             parse_scheme_override(r".*\.down_proj=bits:8"),)))
    outcome = run.run_recipe(recipe, policy=OutputPolicy(), progress=False)
    assert (len(skeletons), len(tokenizers), len(loads), len(calibrations)) == (1, 1, 1, 1)
    log = json.loads((tmp_path / "out" / "quant_log.json").read_text())
    assert outcome.log["recipe_key"] == log["recipe_key"] == recipe.checkpoint_key(tiny_model_dir)
    assert not Path(f"{tmp_path / 'out'}.work").exists()  # the guard stage cleaned up
    # reuse: the finished checkpoint of this exact recipe is kept, nothing is loaded again
    again = run.run_recipe(recipe, reuse=True, progress=False)
    assert again.reused and len(loads) == 1 and len(calibrations) == 1


def test_cli_and_api_drive_run_recipe(tiny_model_dir: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import qcal
    from qcal import run
    from qcal.cli import main

    recipes = _count(monkeypatch, "run_recipe", run)
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "rtn", "--group-size",
                 "32", "--device", "cpu", "-o", str(tmp_path / "cli")]) == 0
    qcal.quantize(str(tiny_model_dir), method="rtn", scheme={"bits": 4, "group_size": 32},
                  device="cpu", output=tmp_path / "api")
    assert [r[0].method_name for r in recipes] == ["rtn", "rtn"]
    cli_log = json.loads((tmp_path / "cli" / "quant_log.json").read_text())
    api_log = json.loads((tmp_path / "api" / "quant_log.json").read_text())
    assert cli_log["recipe_key"] == api_log["recipe_key"]  # the same line, the same checkpoint
    assert ((tmp_path / "cli" / "model.safetensors").read_bytes()
            == (tmp_path / "api" / "model.safetensors").read_bytes())
