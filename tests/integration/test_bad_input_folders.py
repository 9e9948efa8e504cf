"""A model folder holding something other than plain files (issue 52) is refused in one
line, by stat alone, before anything is opened: a FIFO as model.safetensors used to block
open() for minutes, ignoring SIGTERM."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_cases import Cli, within

pytestmark = pytest.mark.integration


def _with(home: Path, name: str, make: str) -> Path:
    model = home / f"m-{make}"
    shutil.copytree(home / "mymodel", model)
    target = model / name
    target.unlink()
    if make == "fifo":
        os.mkfifo(target)
    elif make == "dangling":
        target.symlink_to(model / "nowhere.json")
    elif make == "loop":
        (model / "loop-b").symlink_to(target)
        target.symlink_to(model / "loop-b")
    return model


@pytest.mark.parametrize(("name", "make", "match"), [
    ("model.safetensors", "fifo", "is a FIFO, not a regular file"),
    ("tokenizer.json", "dangling", "is a broken link"),
    ("config.json", "loop", "a link loop"),
])
def test_non_plain_files_are_refused_without_opening(cli: Cli, home: Path, tmp_path: Path,
                                                     name: str, make: str, match: str) -> None:
    model = _with(home, name, make)
    out = tmp_path / "never"

    with within(60, "qcal blocked on the folder's file"):
        cli.refused("quantize", "--model", model, "--method", "rtn", "--group-size", "32",
                    "-o", out, match=match, case=f"model folder: {name} is {make}")
        cli.refused("eval", "--model", model, "--ppl", match=match,
                    case=f"eval: model folder {name} is {make}")
    assert not out.exists()


def _copy(home: Path, name: str) -> Path:
    model = home / name
    shutil.copytree(home / "mymodel", model)
    return model


@pytest.mark.parametrize(("case", "match"), [
    ("stray file", "extra.safetensors besides model.safetensors"),
    ("index beside a full file", "model.safetensors is not in model.safetensors.index.json"),
    ("index naming a missing shard", "names model-00002-of-00002.safetensors, which"),
    ("index not JSON", "is not a safetensors index"),
])
def test_an_ambiguous_weight_set_is_refused(cli: Cli, home: Path, tmp_path: Path, case: str,
                                            match: str) -> None:
    """qcal must read the weights transformers loads, or refuse: never other ones."""
    import json

    model = _copy(home, case.replace(" ", "-"))
    index = model / "model.safetensors.index.json"
    if case == "stray file":
        shutil.copy(model / "model.safetensors", model / "extra.safetensors")
    elif case == "index beside a full file":
        shutil.copy(model / "model.safetensors", model / "model-00001-of-00001.safetensors")
        index.write_text(json.dumps({"weight_map": {"lm_head.weight":
                                                    "model-00001-of-00001.safetensors"}}))
    elif case == "index naming a missing shard":
        (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
        index.write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                    "b": "model-00002-of-00002.safetensors"}}))
    else:
        index.write_text("{not json")
    out = tmp_path / "never"
    cli.refused("quantize", "--model", model, "--method", "rtn", "--group-size", "32", "-o", out,
                match=match, case=f"model folder: {case}")
    assert not out.exists()
