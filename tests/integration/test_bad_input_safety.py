"""Bad input and faults on the tiny model, part 1: never lose a user's files, names are plain
names, resume state and artifacts never run code (security cases prove their payload did
not run). Each refusal exits 2 with one line naming problem and fix, and nothing outside
the output is touched or left behind.

`qcal report --study reliability` runs both parts (test_bad_input_safety.py,
test_bad_input_errors.py) and turns each case's recorded outcome into results/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_cases import Cli, Payload, dead_writer, fsio_host, gptq_args, rtn_args, tree_digest

pytestmark = pytest.mark.integration


# --- 1. never lose a user's files -------------------------------------------------------

def test_output_parent_of_the_model_is_refused(cli: Cli, home: Path) -> None:
    before = tree_digest(home)
    cli.refused(*rtn_args(home, home), match="one of its parents", case="quantize -o <parent of model>")
    cli.refused(*rtn_args(home, home, "--overwrite"), match="one of its parents",
                case="quantize -o <parent of model> --overwrite")
    assert tree_digest(home) == before


def test_output_equal_to_the_model_is_refused(cli: Cli, home: Path) -> None:
    before = tree_digest(home)
    cli.refused(*rtn_args(home, home / "mymodel", "--overwrite"), match="choose a new directory",
                case="quantize -o <model dir>")
    assert tree_digest(home) == before


def test_output_equal_to_the_working_directory_is_refused(cli: Cli, home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    work = home / "project"
    work.mkdir()
    (work / "keep.txt").write_text("x")
    monkeypatch.chdir(work)
    cli.refused(*rtn_args(home, Path("."), "--overwrite"), match="the working directory",
                case="quantize -o .")
    assert (work / "keep.txt").read_text() == "x"


def test_foreign_directory_needs_overwrite(cli: Cli, home: Path) -> None:
    foreign = home / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    cli.refused(*rtn_args(home, foreign), match="--overwrite", case="quantize -o <non-empty foreign dir>")
    assert (foreign / "cat.jpg").read_bytes() == b"\xff\xd8"
    rc, _ = cli(*rtn_args(home, foreign, "--overwrite"))  # the user said so explicitly
    assert rc == 0 and (foreign / "quant_log.json").is_file() and not (foreign / "cat.jpg").exists()


def test_existing_file_as_output_is_refused(cli: Cli, home: Path) -> None:
    cli.refused(*rtn_args(home, home / "notes.txt"), match="not a directory",
                case="quantize -o <existing file>")
    assert (home / "notes.txt").read_text() == "the user's own file\n"


def test_own_checkpoint_is_replaced_and_work_dir_removed(cli: Cli, home: Path) -> None:
    out = home / "ckpt"
    assert cli(*gptq_args(home, out))[0] == 0
    assert not Path(f"{out}.work").exists()  # removed after success
    first = (out / "model.safetensors").read_bytes()
    assert cli(*gptq_args(home, out, "--keep-work"))[0] == 0  # replaces qcal's own output
    assert (out / "model.safetensors").read_bytes() == first
    assert (Path(f"{out}.work") / "progress.json").is_file()
    assert sorted(p.name for p in home.iterdir() if p.name.startswith(".")) == []


def test_calib_build_output_rules(cli: Cli, home: Path) -> None:
    base = ["calib", "build", "--model", home / "mymodel", "--source", home / "calib.txt",
            "--n", "2", "--seqlen", "32"]
    before = tree_digest(home)
    cli.refused(*base, "-o", home, match="one of its parents", case="calib build -o <parent of model>")
    cli.refused(*base, "-o", home / "mymodel", match="choose a new directory",
                case="calib build -o <model dir>")
    assert tree_digest(home) == before
    ckpt = home / "ckpt"
    assert cli(*rtn_args(home, ckpt))[0] == 0
    cli.refused(*base, "-o", ckpt, match="holds a qcal checkpoint",
                case="calib build -o <a qcal checkpoint>")
    assert cli(*base, "-o", home / "set")[0] == 0
    assert cli(*base, "--seed", "1", "-o", home / "set")[0] == 0  # its own kind: replaced


# --- 2. names are plain names -------------------------------------------------------------

def test_compare_name_with_traversal_is_refused(cli: Cli, home: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    cli.refused("compare", "--name", "../../../x", "--model", home / "mymodel", "--methods", "rtn",
                "--results-dir", tmp_path / "results", match="not a plain name",
                case="compare --name ../../../x")
    cfg = home / "grid.yaml"
    cfg.write_text("name: ../escape\nmethods: [rtn]\n")
    cli.refused("compare", "--config", cfg, "--results-dir", tmp_path / "results",
                match="not a plain name", case="grid YAML name: ../escape")
    cli.refused("eval", "--model", home / "mymodel", "--tasks", "../../etc/passwd",
                match="not a plain name", case="eval --tasks ../../etc/passwd")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_stale_cleanup_touches_only_qcal_files(tmp_path: Path) -> None:
    from qcal.fsio import clean_stale_siblings, clean_stale_tree, write_dir_atomically

    root = tmp_path / "grid"
    root.mkdir()
    users = [root / ".notes.tmp-1", root / ".draft.qcal-tmp-user"]  # look alike, not qcal's
    users[0].write_text("mine")
    users[1].mkdir()
    (users[1] / "f").write_text("mine")
    ours = root / f".cell.json.qcal-tmp-{dead_writer()}-a1"
    ours.write_text("{")
    live = root / f".other.json.qcal-tmp-{fsio_host()}-{os.getpid()}-b2"  # a writer still at work
    live.write_text("{")
    clean_stale_tree(root)
    assert all(p.exists() for p in users) and not ours.exists() and live.exists()

    def killed(tmp: Path) -> None:
        raise KeyboardInterrupt  # stands in for a kill during the final save

    out = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        write_dir_atomically(out, killed, "checkpoint")
    assert not out.exists()
    # A real kill would leave the marked temp dir: make one and let the next run clean it.
    stale = tmp_path / f".ckpt.qcal-tmp-{dead_writer()}-abc"
    stale.mkdir()
    (stale / ".qcal-output.json").write_text('{"written_by": "qcal", "kind": "checkpoint"}')
    assert clean_stale_siblings(out) == [stale] and not stale.exists()


def test_next_run_removes_its_stale_temp_dir(cli: Cli, home: Path) -> None:
    out = home / "ckpt"
    stale = home / f".ckpt.qcal-tmp-{dead_writer()}-x1"
    stale.mkdir()
    (stale / ".qcal-output.json").write_text('{"written_by": "qcal", "kind": "checkpoint"}')
    (stale / "model.safetensors").write_bytes(b"partial")
    assert cli(*rtn_args(home, out))[0] == 0
    assert not stale.exists() and (out / "quant_log.json").is_file()


# --- 3. resume state and artifacts never run code ------------------------------------------

def test_crafted_resume_state_never_runs(cli: Cli, home: Path, tmp_path: Path) -> None:
    import pickle

    out = home / "ckpt"
    assert cli(*gptq_args(home, out, "--keep-work"))[0] == 0
    shutil.rmtree(out)  # as if killed before the final save
    work = Path(f"{out}.work")
    flag = tmp_path / "pwned"
    for name in ("layer_0000.pt", "layer_0000.safetensors", "next_inputs.pt"):
        (work / name).write_bytes(pickle.dumps(Payload(flag)))
    cli.refused(*gptq_args(home, out, "--resume"), match="layer_0000.safetensors",
                case="--resume with a crafted (pickle) layer file")
    assert not flag.exists()


def test_pickle_awq_artifact_is_never_loaded(cli: Cli, home: Path, tmp_path: Path) -> None:
    import pickle

    flag = tmp_path / "pwned"
    evil = home / "awq_search.pt"
    evil.write_bytes(pickle.dumps(Payload(flag)))
    cli.refused("quantize", "--model", home / "mymodel", "--method", "awq", "--awq-artifact", evil,
                "-o", home / "o", match="reads only awq_search.safetensors",
                case="--awq-artifact <pickle .pt>")
    renamed = home / "evil.safetensors"
    renamed.write_bytes(pickle.dumps(Payload(flag)))
    cli.refused("quantize", "--model", home / "mymodel", "--method", "awq", "--awq-artifact",
                renamed, "-o", home / "o", match="not a readable qcal AWQ search artifact",
                case="--awq-artifact <pickle renamed .safetensors>")
    assert not flag.exists()


def _remote_code_model(home: Path, flag: Path, model_type: str) -> Path:
    model = home / f"remote-{model_type}"
    shutil.copytree(home / "mymodel", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(flag)!r}).touch()\n")
    return model


def test_remote_code_never_runs_without_the_flag(cli: Cli, home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    flag = tmp_path / "pwned"
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\ny\n"))  # a prompt would say yes
    custom = _remote_code_model(home, flag, "evilmodel")
    cli.refused("quantize", "--model", custom, "--group-size", "32", "-o", home / "o1",
                match="--trust-remote-code", case="model with auto_map + unknown model_type")
    cli.refused("eval", "--model", custom, "--text", home / "calib.txt",
                match="--trust-remote-code", case="eval of a model with auto_map")
    # A known architecture with an auto_map loads with transformers' own code, not the dir's.
    known = _remote_code_model(home, flag, "llama")
    rc, _ = cli("quantize", "--model", known, "--group-size", "32", "-o", home / "o2")
    assert rc == 0
    assert not flag.exists()


