"""The 1.5B peer benchmark's pieces: the truncated copy of a model's first layers, and its
table (ratios against the goals, failed and missing rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.studies.peers_scale import render_scale
from qcal.studies.truncate import kept, truncate_model

pytestmark = pytest.mark.unit


def test_layer_names_are_kept_by_index() -> None:
    assert kept("model.layers.0.mlp.down_proj.weight", 1)
    assert not kept("model.layers.1.mlp.down_proj.weight", 1)
    assert not kept("model.layers.10.self_attn.q_proj.bias", 2)  # 10 is not 1
    assert kept("model.embed_tokens.weight", 1) and kept("lm_head.weight", 1)


def test_truncated_copy_keeps_real_weights_of_the_first_layers(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = truncate_model(tiny_model_dir, 1, tmp_path / "t1")
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    cut = load_file(str(out / "model.safetensors"))
    assert set(cut) == {k for k in original if ".layers.1." not in k}
    assert all(torch.equal(cut[k], original[k]) for k in cut)
    net = AutoModelForCausalLM.from_pretrained(str(out))
    assert len(net.model.layers) == 1
    assert json.loads((out / "TRUNCATED.json").read_text())["layers_in_model"] == 2
    with pytest.raises(SystemExit, match="has 2 layers"):
        truncate_model(tiny_model_dir, 3, tmp_path / "t3")


def _run(quantize_s: float, rss_mib: float = 2048.0) -> dict[str, object]:
    return {"returncode": 0, "wall_seconds": quantize_s + 10, "quantize_seconds": quantize_s,
            "max_rss_mib": rss_mib, "load_before": [1.0], "load_after": [2.0]}


def test_scale_table_states_the_goals_and_failures() -> None:
    data = {"setting": {"layers": 4}, "n_layers": 4, "model_layers": 28,
            "provenance": {"model": "models/qwen2.5-coder-1.5b"},
            "state": {"qcal-gptq": _run(40.0), "gptqmodel-gptq": _run(100.0),
                      "qcal-awq": _run(80.0),
                      "gptqmodel-awq": {"returncode": 1, "error_tail": "ValueError: no CPU AWQ\n"
                                        "Command exited with non-zero status 1"}}}
    md = render_scale(data)
    assert "qcal / GPTQModel: 0.40 (goal <= 0.6: met)" in md
    assert "qcal AWQ / qcal GPTQ quantize time: 2.00 (goal <= 1.5: not met)" in md
    assert "failed: ValueError: no CPU AWQ |" in md
    data["partial"] = {"gptqmodel-awq": {"layer_seconds": [730.5]}}
    assert "failed: ValueError: no CPU AWQ (after 1 layer(s): 730 s) | 730.500 |" in render_scale(data)
    assert "first 4 of its 28 layers" in md
    assert "| 10.000 |" in md  # qcal GPTQ: 40 s over 4 layers


def test_paired_accuracy_counts_argmax_against_gold(tmp_path: Path) -> None:
    from qcal.studies.scale_report import paired_accuracy

    lines = []
    for i in range(20):  # the base is right on all 20 items, the checkpoint on the first 15
        lines.append(json.dumps({"task": "t", "doc_id": i, "gold": 1, "base_lls": [-2.0, -1.0],
                                 "model_lls": [-1.0, -2.0] if i >= 15 else [-3.0, -1.0]}))
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    test = paired_accuracy(tmp_path / "items.jsonl")["t"]
    assert test["mean_b"] == 1.0 and test["mean_a"] == 0.75 and test["units"] == 20
    assert test["delta"] == -0.25 and test["ci_high"] < 0


def test_journey_table_shows_failures_and_the_answer() -> None:
    from qcal.studies.scale_report import render_journeys

    data = {"model": "qwen2.5-coder-1.5b", "provenance": {"command": "x"}, "evals": {},
            "state": {"quantize/rtn": {**_run(12.5), "checkpoint_mib": 3000.0},
                      "ppl/rtn": {"returncode": 1, "error_tail": "qcal eval: error: boom\n"},
                      "generate/rtn": {**_run(0.0), "prompt": "Reverse a string.",
                                       "answer": "def rev(s):\n    return s[::-1]",
                                       "new_tokens": 12, "classes": ["CompressedLinear"]}}}
    md = render_journeys(data)
    assert "# Journeys on qwen2.5-coder-1.5b" in md
    assert "quantize 12.5 s, 3000.0 MiB" in md and "failed: qcal eval: error: boom" in md
    assert "return s[::-1]" in md and "12 tokens; CompressedLinear" in md


def _previous(tmp_path: Path, flags: dict) -> Path:
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({
        "model": "m", "flags": flags,
        "provenance": {"date": "2026-12-07 02:43 UTC", "git_commit": "abc1234"},
        "state": {"quantize/rtn": {"returncode": 0, "quantize_seconds": 21.0},
                  "ppl/rtn": {"returncode": 0, "result": "eval-ppl-rtn.json"},
                  "generate/rtn": {"returncode": 1, "error_tail": "boom"}},
        "evals": {"ppl/rtn": {"perplexity": {"model": {"en": {"ppl": 18.3}}}}}}))
    return out


def test_a_fresh_work_folder_gets_back_the_committed_steps_and_reruns_the_rest(
        tmp_path: Path) -> None:
    from qcal.studies.bench import Steps
    from qcal.studies.scale_journeys import _needs_checkpoint, restore

    flags = {"quantize": {"rtn": ["--method", "rtn"]}}
    previous, work = _previous(tmp_path, flags), tmp_path / "work"
    steps = Steps(work, {"model": "m"})
    data = json.loads(previous.read_text())
    assert restore(steps, data, previous.name, work, "m", flags) == ["quantize/rtn", "ppl/rtn"]
    assert steps.get("generate/rtn") is None  # a failed step runs again
    assert json.loads((work / "eval-ppl-rtn.json").read_text())["perplexity"]["model"]["en"]
    assert "abc1234" in steps.get("quantize/rtn")["restored_from"]
    # The checkpoint's files were not committed: a step that needs them re-quantizes first.
    assert _needs_checkpoint(steps, "eval-alone/rtn", work) == "quantize/rtn"
    assert _needs_checkpoint(steps, "ppl/rtn", work) is None  # restored: does not run
    # Kept in the cache: a second call restores nothing more.
    assert restore(Steps(work, {"model": "m"}), data, previous.name, work, "m", flags) == []


def test_results_of_other_flags_are_not_restored(tmp_path: Path) -> None:
    from qcal.studies.bench import Steps
    from qcal.studies.scale_journeys import restore

    previous = _previous(tmp_path, {"quantize": {"rtn": ["--method", "rtn"]}})
    steps = Steps(tmp_path / "work", {"model": "m"})
    data = json.loads(previous.read_text())
    assert restore(steps, data, previous.name, tmp_path / "work", "m", {"quantize": {}}) == []
    assert restore(steps, data, previous.name, tmp_path / "work", "other", {}) == []
