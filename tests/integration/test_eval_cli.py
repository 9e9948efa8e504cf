"""`qcal eval` end to end on the tiny Llama: float vs RTN-w4, a tiny local task, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from qcal.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_rtn(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny-rtn-w4g64"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "rtn",
                 "--group-size", "64", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10-item next-sentence task built from stdlib docstrings, one 'section' per module."""
    from qcal.eval.local_tasks import build_nextsent_items, write_task
    from qcal.model.tiny import stdlib_text

    docs = [(f"stdlib/en/eval/doc{i}/0", t) for i, t in enumerate(stdlib_text()[:60])]
    items = build_nextsent_items(docs, "en", n_items=10, context_sentences=2, min_context=1)
    out = tmp_path_factory.mktemp("tasks")
    write_task(out, "tiny_nextsent", items, "en")
    return out


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qcal.model.tiny import stdlib_text

    path = tmp_path_factory.mktemp("text") / "held_out.txt"
    path.write_text("\n\n".join(stdlib_text()[60:90]))
    return path


def test_float_vs_rtn_end_to_end(tiny_model_dir: Path, tiny_rtn: Path, tiny_task: Path,
                                 text_file: Path, tmp_path: Path) -> None:
    stem = tmp_path / "res" / "eval_tiny"
    rc = main(["eval", "--model", str(tiny_rtn), "--base", str(tiny_model_dir), "--ppl",
               "--text", str(text_file), "--seqlen", "64", "--max-windows", "3",
               "--tasks", "tiny_nextsent", "--include-path", str(tiny_task), "--calibration",
               "--ece-bins", "10", "-o", str(stem)])
    assert rc == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["model"]["quantized"] and data["model"]["method"] == "rtn"
    assert data["base"]["quantized"] is False
    ppl = data["perplexity"]
    assert ppl["model"]["file"]["tokens"] == ppl["base"]["file"]["tokens"] == 3 * 63
    div = ppl["divergence"]["file"]
    assert div["kl_mean"] > 0 and 0 < div["js_mean"] < div["js_max_nats"]
    assert div["kl_reverse_mean"] > 0 and div["kl_reverse_mean"] != div["kl_mean"]
    assert 0 < div["top1_agreement"] <= 1
    loc = div["localization"]
    assert 0 < loc["worst_1pct_share"] <= 1 and sum(loc["kl_share_by_position_decile"]) == \
        pytest.approx(1.0)
    assert all(isinstance(t["token"], str) for t in loc["top_tokens"])

    cal = data["calibration"]["tiny_nextsent"]
    for role in ("model", "base"):
        assert cal[role]["raw"]["n"] == 10 and cal[role]["raw"]["bins"] == 10
        # confidence metrics describe the very predictions behind lm-eval's acc
        assert cal[role]["raw"]["acc"] == pytest.approx(cal[role]["lm_eval_acc"])
    drift = data["drift"]["tiny_nextsent"]["raw"]
    assert drift["n"] == 10 and 0 <= drift["flip_rate"] <= 1
    assert 0 < drift["mcnemar_p"] <= 1
    assert sum(q["n"] for q in drift["by_base_conf_quantile"]) == 10
    assert all(math.isfinite(q["delta_log_odds_true"]) for q in drift["by_base_conf_quantile"])

    md = stem.with_suffix(".md").read_text()
    assert "qcal eval" in md and "tiny-rtn-w4g64" in md and "Calibration set" in md
    assert "d log-odds" in md and "KL(q||float)" in md and "McNemar p" in md
    assert "Where the divergence sits" in md
    png = stem.with_name("eval_tiny_reliability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(x) for x in stem.with_name("eval_tiny_items.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all("delta_conf_true" in r for r in rows)
    from qcal.eval.perplexity import load_token_nll

    streams = load_token_nll(stem.with_name("eval_tiny_token_nll.safetensors"))
    assert streams["model/file"].shape == streams["base/file"].shape == (3 * 63,)
    assert streams["kl_reverse/file"].shape == (3 * 63,)


def test_lm_eval_scores_the_in_memory_quantized_model(tiny_rtn: Path, tiny_task: Path) -> None:
    """lm-eval's per-choice log-likelihood equals a direct forward pass of qcal's model."""
    from qcal.eval.harness import resolve_tasks, run_tasks, task_manager
    from qcal.eval.local_tasks import read_items
    from qcal.model.loading import load_model
    from qcal.packing.qlinear import QuantLinear

    net, tok, _ = load_model(tiny_rtn)
    assert any(isinstance(m, QuantLinear) for m in net.modules())
    tm = task_manager([tiny_task], ["tiny_nextsent"])
    run = run_tasks(net, tok, resolve_tasks(["tiny_nextsent"], tm, [tiny_task]), tm, limit=2)
    rec = run.items["tiny_nextsent"][0]
    item = read_items(tiny_task / "tiny_nextsent.jsonl")[rec.doc_id]
    ctx = tok(item["context"], add_special_tokens=False)["input_ids"]
    full = tok(item["context"] + " " + item["choices"][1], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(net(input_ids=torch.tensor([full])).logits[0].float(), -1)
    cont = full[len(ctx):]
    direct = sum(float(logp[len(ctx) - 1 + k, t]) for k, t in enumerate(cont))
    assert rec.lls[1] == pytest.approx(direct, abs=1e-3)
    assert rec.lengths[1] == len(item["choices"][1])


def test_calibration_without_base(tiny_rtn: Path, tiny_task: Path, tmp_path: Path) -> None:
    stem = tmp_path / "cal"
    assert main(["eval", "--model", str(tiny_rtn), "--tasks", "tiny_nextsent", "--include-path",
                 str(tiny_task), "--calibration", "--limit", "4", "-o", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert "perplexity" not in data and "drift" not in data  # --tasks alone: no ppl
    assert data["calibration"]["tiny_nextsent"]["model"]["norm"]["n"] == 4
    md = stem.with_suffix(".md").read_text()
    assert "## Confidence calibration" in md and "## Drift" not in md
    assert stem.with_name("cal_reliability.png").is_file()


def test_per_task_limits(tiny_rtn: Path, tiny_task: Path, tmp_path: Path,
                         capsys: pytest.CaptureFixture) -> None:
    stem = tmp_path / "limits"
    assert main(["eval", "--model", str(tiny_rtn), "--tasks", "tiny_nextsent,qcal_nextsent_en",
                 "--include-path", str(tiny_task), "--calibration", "--limit", "5",
                 "--task-limit", "tiny_nextsent=3", "-o", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["lm_eval"]["info"]["limits"] == {"tiny_nextsent": 3, "qcal_nextsent_en": 5}
    assert data["calibration"]["tiny_nextsent"]["model"]["norm"]["n"] == 3
    assert data["calibration"]["qcal_nextsent_en"]["model"]["norm"]["n"] == 5
    assert data["settings"]["task_limits"] == [["tiny_nextsent", 3]]
    for bad, says in ((["--task-limit", "tiny_nextsent"], "write TASK=N"),
                      (["--task-limit", "other=2"], "not in --tasks"),
                      (["--task-limit", "tiny_nextsent=0"], "positive number")):
        rc = main(["eval", "--model", str(tiny_rtn), "--tasks", "tiny_nextsent",
                   "--include-path", str(tiny_task), *bad])
        err = capsys.readouterr().err
        assert rc == 2 and says in err and "Traceback" not in err, err


def test_unknown_task_lists_local_tasks(tiny_model_dir: Path, capsys: pytest.CaptureFixture
                                        ) -> None:
    rc = main(["eval", "--model", str(tiny_model_dir), "--tasks", "no_such_task_xyz"])
    err = capsys.readouterr().err
    assert rc == 2 and "no_such_task_xyz" in err and "qcal_nextsent_en" in err
    assert "Traceback" not in err


def test_empty_item_file_fails_before_loading(tiny_model_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    from qcal.eval.local_tasks import task_yaml

    (tmp_path / "empty_task.jsonl").write_text("")
    (tmp_path / "empty_task.yaml").write_text(task_yaml("empty_task", "empty_task.jsonl", "en"))
    rc = main(["eval", "--model", str(tiny_model_dir), "--tasks", "empty_task",
               "--include-path", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "empty_task.jsonl" in err and "has no items" in err


def test_checkpoint_missing_tensors_fails_clearly(tiny_rtn: Path, text_file: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_rtn, broken)
    state = load_file(str(broken / "model.safetensors"))
    victim = next(k for k in state if k.endswith((".qweight", ".weight_packed")))
    del state[victim]
    save_file(state, str(broken / "model.safetensors"))
    rc = main(["eval", "--model", str(broken), "--text", str(text_file), "--seqlen", "64"])
    err = capsys.readouterr().err
    assert rc == 2 and victim.rsplit(".", 1)[0] in err and "Traceback" not in err


def test_calibration_without_tasks_is_an_error(capsys: pytest.CaptureFixture) -> None:
    assert main(["eval", "--calibration"]) == 2
    assert "--tasks" in capsys.readouterr().err


@pytest.mark.slow
def test_default_model_ppl_defaults(default_model_dir: Path, tmp_path: Path) -> None:
    """`qcal eval --ppl` with no --model and no --langs: the default model on English."""
    from qcal.data import CorpusNotFoundError, eval_text

    try:
        eval_text("en")
    except CorpusNotFoundError as err:
        pytest.skip(f"corpus not provisioned ({err})")
    stem = tmp_path / "ppl"
    assert main(["eval", "--ppl", "--max-windows", "1", "-o", str(stem)]) == 0
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["model"]["path"] == str(default_model_dir)
    row = data["perplexity"]["model"]["en"]
    assert row["tokens"] == 511 and 1 < row["ppl"] < 200


def test_uncached_hub_dataset_fails_before_loading(tiny_model_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: qcal-tests/never-published\noutput_type: multiple_choice\n"
        "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: 0\ndoc_to_choice: ['a', 'b']\n"
        "metric_list:\n  - metric: acc\n"
    )
    rc = main(["eval", "--model", str(tiny_model_dir), "--tasks", "hub_task",
               "--include-path", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "qcal-tests/never-published" in err and "local HF cache" in err
    assert "Traceback" not in err


def test_vllm_backend_needs_vllm_and_tasks(tiny_model_dir: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    import importlib.util

    assert main(["eval", "--model", str(tiny_model_dir), "--backend", "vllm", "--ppl"]) == 2
    assert "--tasks only" in capsys.readouterr().err
    if importlib.util.find_spec("vllm") is None:
        assert main(["eval", "--model", str(tiny_model_dir), "--backend", "vllm", "--tasks",
                     "qcal_nextsent_en"]) == 2
        assert "needs the vllm package" in capsys.readouterr().err


def _store_lines(folder: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.jsonl"))}


def test_scores_resume_and_share_the_base(tiny_model_dir: Path, tiny_rtn: Path, tiny_task: Path,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--scores DIR: a rerun scores nothing again (same numbers), and a second checkpoint
    against the same base reuses the base's file instead of scoring it anew."""
    from qcal.eval import harness

    scores = tmp_path / "scores"
    common = ["--base", str(tiny_model_dir), "--tasks", "tiny_nextsent", "--include-path",
              str(tiny_task), "--limit", "6", "--scores", str(scores)]
    assert main(["eval", "--model", str(tiny_rtn), *common, "-o", str(tmp_path / "a")]) == 0
    first = _store_lines(scores)
    assert len(first) == 2 and all(n > 1 for n in first.values())  # model and base, scored
    calls: list[int] = []
    real = harness.run_tasks

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        store = kwargs.get("score_store")
        calls.append(len(store.scores) if store is not None else -1)
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "run_tasks", counting)
    assert main(["eval", "--model", str(tiny_rtn), *common, "-o", str(tmp_path / "b")]) == 0
    assert _store_lines(scores) == first  # nothing scored twice
    assert all(n > 0 for n in calls)  # both roles started from their stored scores
    a = json.loads((tmp_path / "a.json").read_text())["lm_eval"]["results"]
    b = json.loads((tmp_path / "b.json").read_text())["lm_eval"]["results"]
    assert a == b

    other = tmp_path / "rtn-g32"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "rtn",
                 "--group-size", "32", "-o", str(other)]) == 0
    assert main(["eval", "--model", str(other), *common, "-o", str(tmp_path / "c")]) == 0
    third = _store_lines(scores)
    assert len(third) == 3 and {k: third[k] for k in first} == first  # the base's file is reused


def test_scores_needs_tasks_and_a_folder(tiny_model_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--model", str(tiny_model_dir), "--scores", str(tmp_path)]) == 2
    assert "add --tasks" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["eval", "--model", str(tiny_model_dir), "--tasks", "qcal_nextsent_en",
                 "--scores", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err
