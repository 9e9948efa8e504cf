"""The comparison grid's spec and configs, without running cells: which cells a grid plans,
how its axes key them, and that every committed study config is valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grid_cases import spec_for

from qcal.errors import ConfigError
from qcal.grid import plan_cells

pytestmark = pytest.mark.integration


def test_plan_has_float_one_rtn_and_selector_cells(tiny_model_dir: Path, texts) -> None:
    keys = [c.key for c in plan_cells(spec_for(tiny_model_dir, texts))]
    assert keys == ["float", "none__rtn", "random__gptq", "zipf__gptq"]


def test_unknown_method_lists_known(tiny_model_dir: Path, texts) -> None:
    with pytest.raises(ConfigError, match="known: .*gptq.*rtn"):
        spec_for(tiny_model_dir, texts, methods=("nope",))


def test_desc_act_reaches_gptq_config_only(tiny_model_dir: Path, texts) -> None:
    spec = spec_for(tiny_model_dir, texts, desc_act=True, methods=("rtn", "gptq", "awq"))
    assert spec.method_config("gptq").desc_act is True
    assert spec_for(tiny_model_dir, texts).method_config("gptq").desc_act is False
    assert not hasattr(spec.method_config("rtn"), "desc_act")


def test_task_limits_reach_the_eval_config(tiny_model_dir: Path, texts) -> None:
    from qcal.config import from_dict, to_dict
    from qcal.grid import grid_from_dict
    from qcal.run_config import EvalConfig, task_limit_map

    spec = spec_for(tiny_model_dir, texts, tasks=("qcal_nextsent_en", "qcal_nextsent_de"),
                    limit=20, task_limits={"qcal_nextsent_de": 5})
    cfg = spec.eval_config()
    assert cfg.task_limits == (("qcal_nextsent_de", 5),)
    assert task_limit_map(cfg.tasks, cfg.limit, cfg.task_limits) == {"qcal_nextsent_en": 20,
                                                                     "qcal_nextsent_de": 5}
    assert from_dict(EvalConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg
    with pytest.raises(ConfigError, match="must map a task"):
        grid_from_dict({"task_limits": ["mmlu", 50]})
    with pytest.raises(ConfigError, match="not in --tasks"):
        spec_for(tiny_model_dir, texts, tasks=("qcal_nextsent_en",),
                 task_limits={"mmlu": 5}).eval_config()


def test_cli_desc_act_flag_sets_grid_field() -> None:
    import argparse

    from qcal.commands.compare import _overrides, add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    on = _overrides(parser.parse_args(["compare", "--desc-act"]))
    off = _overrides(parser.parse_args(["compare"]))
    assert on["desc_act"] is True and "desc_act" not in off


@pytest.mark.parametrize("name", ["multilingual_grid", "zipcal_grid"])
def test_study_config_files_parse(name: str) -> None:
    from qcal.grid import load_grid_config

    spec = load_grid_config(Path(__file__).parents[2] / "configs" / f"{name}.yaml")
    assert spec.name == name and spec.desc_act and spec.nsamples == 16
    assert len(plan_cells(spec)) == 2 + 2 * len(spec.selectors)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "configs").glob("study_*.yaml")),
                         ids=lambda p: p.stem)
def test_evidence_study_configs_are_valid(path: Path) -> None:
    from qcal.grid import load_grid_config

    spec = load_grid_config(path)
    assert spec.name == path.stem and len(spec.values("seed")) in (1, 3)
    cfg = spec.eval_config()  # task names, per-task limits and confidence settings check here
    assert all(task in cfg.tasks for task, _ in cfg.task_limits)
    for selector in spec.selectors:
        spec.calib_config(selector)  # selector options parse
    assert plan_cells(spec)


def test_axes_expand_cells_and_keep_single_value_keys(tiny_model_dir: Path, texts) -> None:
    spec = spec_for(tiny_model_dir, texts, seed=(0, 1), sym=(False, True), desc_act=(False, True))
    keys = [c.key for c in plan_cells(spec)]
    assert keys[0] == "float"  # one model: the float cell keeps its name
    rtn = [k for k in keys if k.startswith("none__rtn")]
    assert rtn == ["none__rtn__asym", "none__rtn__sym"]  # no seed or act-order axis for RTN
    gptq = [k for k in keys if "__gptq" in k]
    assert len(gptq) == 2 * 2 * 2 * 2 and "zipf__gptq__s1__sym__act" in gptq
    cell = next(c for c in plan_cells(spec) if c.key == "random__gptq__s1__sym__noact")
    recipe = spec.recipe(cell, "/tmp/x")
    assert recipe.calib.seed == 1 and recipe.scheme.sym and not recipe.method.desc_act
    # YAML's plural spellings load too.
    from qcal.grid import grid_from_dict

    raw = {"name": "g", "model": str(tiny_model_dir), "seeds": [0, 1, 2], "methods": ["rtn"]}
    assert grid_from_dict(raw).values("seed") == (0, 1, 2)


@pytest.mark.parametrize("suffix", ["", "_gemma3"])
def test_benchmark_and_confidence_grids_cover_the_benchmarks_once(suffix: str) -> None:
    from qcal.grid import load_grid_config

    configs = Path(__file__).parents[2] / "configs"
    bench = load_grid_config(configs / f"study_benchmarks{suffix}.yaml")
    confidence = load_grid_config(configs / f"study_confidence{suffix}.yaml")
    assert bench.model == confidence.model
    assert not set(bench.tasks) & set(confidence.tasks)  # no task scored twice
    required = {"arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "boolq",
                "openbookqa", "sciq", "copa", "mmlu", "lambada_openai", "qcal_nextsent"}
    assert required <= set(bench.tasks) | set(confidence.tasks)
    # multiemo's source (the bigbench sdist) was withdrawn: only the default model's finished
    # confidence grid has it; Gemma's records that it dropped it after two cells.
    multiemo = {t for t in set(bench.tasks) | set(confidence.tasks) if t.startswith("multiemo")}
    if suffix:
        saved = json.loads((configs.parent / "results" / f"study_confidence{suffix}" /
                            "grid.json").read_text())
        assert not multiemo and saved["dropped_tasks"][0]["tasks"] == ["multiemo_en",
                                                                       "multiemo_pl"]
    else:
        assert multiemo == {"multiemo_en", "multiemo_pl"} <= set(confidence.tasks)
    # The benchmark grid's one draw is the confidence grid's seed 0 (same checkpoints).
    assert bench.values("seed") == (0,) and 0 in confidence.values("seed")
    fields = ("selectors", "methods", "source", "nsamples", "seqlen", "bits", "group_size",
              "desc_act", "allow_ragged_groups")
    assert {f: getattr(bench, f) for f in fields} == {f: getattr(confidence, f) for f in fields}
