"""Calibration inputs a user hands over (issue 52): data files, saved datasets, tokenizers
and chat templates are read, and refused in one line, before the run creates its output
(the output guard is made to fail the test if it is reached); nothing is copied into the
datasets cache; a saved dataset reads no file outside its folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_cases import Cli

pytestmark = pytest.mark.integration
PATTERN = "10. Data, tokenizers and chat templates read before any output (issue 52)"

CHATS = [{"messages": [{"role": "user", "content": "hello " * 30},
                       {"role": "assistant", "content": "hi there " * 30}]}] * 8


@pytest.fixture()
def no_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output guard runs only after every input was read: reaching it fails the test."""
    import qcal.run

    def reached(*_: object, **__: object) -> None:
        raise AssertionError("the run reached its output guard before refusing the input")

    monkeypatch.setattr(qcal.run, "guarded_output", reached)


def _gptq(home: Path, model: Path, calib: Path, *extra: str) -> list:
    return ["quantize", "--model", model, "--method", "gptq", "--group-size", "32", "--calib",
            calib, "--nsamples", "2", "--seqlen", "32", "-o", home / "o", *extra]


def _saved(home: Path, name: str) -> Path:
    from datasets import Dataset

    path = home / name
    Dataset.from_dict({"text": ["some calibration text " * 40] * 8}).save_to_disk(str(path))
    return path


def test_saved_dataset_naming_a_file_outside_is_refused(cli: Cli, home: Path,
                                                        no_output: None) -> None:
    folder = _saved(home, "ds")
    arrow = next(folder.glob("*.arrow"))
    shutil.move(arrow, home / "outside.arrow")
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": "../outside.arrow"}]
    (folder / "state.json").write_text(json.dumps(state))
    cli.refused(*_gptq(home, home / "mymodel", folder), match="which is not a plain file in",
                case="save_to_disk state.json naming ../outside.arrow (read it, exit 0)")


@pytest.mark.parametrize(("case", "spoil", "match"), [
    ("garbage state.json", lambda f: (f / "state.json").write_text("{garbage"),
     "is not a save_to_disk state"),
    ("truncated arrow file", lambda f: (lambda a: a.write_bytes(a.read_bytes()[:300]))(
        next(f.glob("*.arrow"))), "is not a readable save_to_disk folder"),
])
def test_broken_saved_dataset_is_refused(cli: Cli, home: Path, no_output: None, case: str,
                                         spoil: object, match: str) -> None:
    folder = _saved(home, "ds")
    spoil(folder)  # type: ignore[operator]
    cli.refused(*_gptq(home, home / "mymodel", folder), match=match,
                case=f"save_to_disk folder: {case}")


def test_parquet_leaves_no_copy_in_the_datasets_cache(cli: Cli, home: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    cache = tmp_path / "hf-datasets"
    cache.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    fake = home / "fake.parquet"
    fake.write_text("not parquet at all")
    cli.refused(*_gptq(home, home / "mymodel", fake), match="is not a readable Parquet file",
                case="a text file named .parquet")
    good = home / "calib.parquet"
    datasets.Dataset.from_dict({"text": ["calibration text " * 60] * 8}).to_parquet(str(good))
    rc, err = cli(*_gptq(home, home / "mymodel", good, "--overwrite"))
    assert rc == 0, err
    assert not list(cache.rglob("*.arrow")), "a copy of the user's data stayed in the cache"


def test_tokenizer_json_lacking_its_model_is_refused(cli: Cli, home: Path,
                                                     no_output: None) -> None:
    tok = home / "mymodel" / "tokenizer.json"
    data = json.loads(tok.read_text())
    del data["model"]
    tok.write_text(json.dumps(data))
    cli.refused("quantize", "--model", home / "mymodel", "--group-size", "32", "-o", home / "o",
                match="no usable tokenizer", case="tokenizer.json without its model")


TEMPLATES = [
    ("a range over the sandbox's bound", "{% for i in range(10**9) %}x{% endfor %}",
     "Range too big"),
    ("a loop of minutes per record",
     "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "took over 5 s on one record"),
    ("megabytes per record", "{% for i in range(9999) %}{{ messages[0].content * 100 }}"
                             "{% endfor %}", "characters of messages"),
    ("raise_exception", "{{ raise_exception('roles must alternate') }}",
     "TemplateError: roles must alternate"),
    ("a syntax error", "{% for %}", "TemplateSyntaxError"),
    ("a sandbox escape", "{{ ''.__class__.__mro__ }}", "SecurityError"),
]


@pytest.mark.parametrize(("case", "template", "match"), TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_bad_chat_templates_are_refused_in_one_line(cli: Cli, home: Path, no_output: None,
                                                    case: str, template: str,
                                                    match: str) -> None:
    cfg_file = home / "mymodel" / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["chat_template"] = template
    cfg_file.write_text(json.dumps(cfg))
    chats = home / "chats.jsonl"
    chats.write_text("\n".join(json.dumps(c) for c in CHATS))
    cli.refused(*_gptq(home, home / "mymodel", chats, "--chat"), match=match,
                case=f"chat template: {case}")


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_a_data_file_that_never_ends_is_refused_unread(cli: Cli, home: Path, make: str) -> None:
    import os

    if make == "fifo":
        path = home / "pipe.txt"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    kind, shown = ("FIFO", "a FIFO") if make == "fifo" else ("device", "/dev/zero")
    cli.refused(*_gptq(home, home / "mymodel", path), match=f"is a {kind}, not a regular file",
                case=f"--calib {shown} (blocked, or read without end)")
    cli.refused("eval", "--model", home / "mymodel", "--text", path, match="not a regular file",
                case=f"eval --text {shown}")
