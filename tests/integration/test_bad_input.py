"""Bad input and faults on the tiny model: exit code 2, one line naming problem and fix,
and nothing outside the output touched or left behind. Security cases prove their
payload did not run.

`python scripts/reliability_table.py` runs this file and turns each case's recorded
outcome into results/reliability.md.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qcal.cli import main
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration


def _tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` with its content hash: 'nothing was touched' made checkable."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class Cli:
    """Runs `qcal` in-process; records each case for the reliability table."""

    def __init__(self, capsys: pytest.CaptureFixture, request: pytest.FixtureRequest) -> None:
        self.capsys, self.request = capsys, request

    def __call__(self, *argv: str) -> tuple[int, str]:
        self.capsys.readouterr()
        rc = main([str(a) for a in argv])
        err = self.capsys.readouterr().err
        return rc, err

    def refused(self, *argv: str, match: str, case: str) -> str:
        """Exit 2 with exactly one `error:` line that contains `match`; returns that line."""
        rc, err = self(*argv)
        errors = [ln for ln in err.splitlines() if "error:" in ln]
        assert rc == 2, err
        assert "Traceback" not in err
        assert len(errors) == 1, err
        assert match in errors[0], errors[0]
        self.record(case, argv, rc, errors[0])
        return errors[0]

    def record(self, case: str, argv: tuple, rc: int, line: str) -> None:
        log = os.environ.get("QCAL_RELIABILITY_LOG")
        if not log:
            return
        tmp = str(self.request.getfixturevalue("tmp_path"))

        def short(text: str) -> str:  # the test's temp folder stands for the user's folder
            return text.replace(tmp, "$T")

        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"test": self.request.node.name, "case": case,
                                     "command": short("qcal " + " ".join(map(str, argv))),
                                     "exit": rc, "line": short(line.strip())}) + "\n")


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture, request: pytest.FixtureRequest) -> Cli:
    return Cli(capsys, request)


@pytest.fixture()
def home(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: /x/mymodel (a copy of the tiny model), /x/notes.txt, calib text."""
    x = tmp_path / "x"
    shutil.copytree(tiny_model_dir, x / "mymodel")
    (x / "notes.txt").write_text("the user's own file\n")
    (x / "calib.txt").write_text("\n\n".join(stdlib_text()[:60]), encoding="utf-8")
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("QCAL_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("QCAL_CALIB_DIR", str(tmp_path / "calib_sets"))
    monkeypatch.chdir(tmp_path)
    return x


def fsio_host() -> str:
    from qcal import fsio

    return fsio._HOST


def dead_writer() -> str:
    """`<host>-<pid>` of a process that has exited, as a killed qcal leaves in temp names."""
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{fsio_host()}-{proc.pid}"


def gptq_args(x: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", x / "mymodel", "--method", "gptq", "--group-size", "32",
            "--calib", x / "calib.txt", "--nsamples", "4", "--seqlen", "32", "-o", out, *extra]


def rtn_args(x: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", x / "mymodel", "--group-size", "32", "-o", out, *extra]


# --- 1. never lose a user's files -------------------------------------------------------

def test_output_parent_of_the_model_is_refused(cli: Cli, home: Path) -> None:
    before = _tree_digest(home)
    cli.refused(*rtn_args(home, home), match="one of its parents", case="quantize -o <parent of model>")
    cli.refused(*rtn_args(home, home, "--overwrite"), match="one of its parents",
                case="quantize -o <parent of model> --overwrite")
    assert _tree_digest(home) == before


def test_output_equal_to_the_model_is_refused(cli: Cli, home: Path) -> None:
    before = _tree_digest(home)
    cli.refused(*rtn_args(home, home / "mymodel", "--overwrite"), match="choose a new directory",
                case="quantize -o <model dir>")
    assert _tree_digest(home) == before


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
    before = _tree_digest(home)
    cli.refused(*base, "-o", home, match="one of its parents", case="calib build -o <parent of model>")
    cli.refused(*base, "-o", home / "mymodel", match="choose a new directory",
                case="calib build -o <model dir>")
    assert _tree_digest(home) == before
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

class Payload:
    """A pickle that, if ever unpickled, creates `flag`."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.flag}",))


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


# --- 4. one clear line instead of a traceback ------------------------------------------------

def test_malformed_config_json(cli: Cli, home: Path) -> None:
    (home / "mymodel" / "config.json").write_text('{"model_type": "llama", ')
    for method in ("rtn", "awq"):
        cli.refused("quantize", "--model", home / "mymodel", "--method", method, "--calib",
                    home / "calib.txt", "--nsamples", "2", "--seqlen", "32", "-o", home / "o",
                    match="is not valid JSON", case=f"malformed config.json (quantize {method})")
    cli.refused("eval", "--model", home / "mymodel", "--text", home / "calib.txt",
                match="is not valid JSON", case="malformed config.json (eval)")
    assert not (home / "o").exists()


def test_calib_source_typo_lists_known_sources(cli: Cli, home: Path) -> None:
    cli.refused("quantize", "--model", home / "mymodel", "--method", "gptq", "--calib",
                "debian-handbok", "-o", home / "o", match="did you mean 'debian-handbook'",
                case="--calib debian-handbok")
    assert not (home / "o").exists() and not (home / "o.work").exists()


def test_truncated_model_safetensors(cli: Cli, home: Path) -> None:
    weights = home / "mymodel" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cli.refused(*rtn_args(home, home / "o"), match="truncated or corrupted",
                case="truncated float model.safetensors")
    assert not (home / "o").exists()


def test_checkpoint_bits_do_not_match_tensors(cli: Cli, home: Path) -> None:
    ckpt = home / "ckpt"
    assert cli(*rtn_args(home, ckpt))[0] == 0
    cfg = json.loads((ckpt / "config.json").read_text())
    for bits, match in ((8, "does not match its config.json"), (3, "checkpoints hold (2, 4, 8)-bit weights")):
        cfg["quantization_config"]["bits"] = bits
        (ckpt / "config.json").write_text(json.dumps(cfg))
        cli.refused("eval", "--model", ckpt, "--text", home / "calib.txt", match=match,
                    case=f"checkpoint config says bits={bits}, tensors are 4-bit")


def test_eval_text_that_is_not_utf8(cli: Cli, home: Path) -> None:
    latin = home / "latin1.txt"
    latin.write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50)
    cli.refused("eval", "--model", home / "mymodel", "--text", latin, match="is not UTF-8",
                case="eval --text <latin-1 file>")
    binary = home / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 20)
    cli.refused("eval", "--model", home / "mymodel", "--text", binary, match="binary file",
                case="eval --text <binary file>")


def test_pickle_only_model_is_refused(cli: Cli, home: Path, tmp_path: Path) -> None:
    import pickle

    flag = tmp_path / "pwned"
    weights = home / "mymodel" / "model.safetensors"
    weights.rename(home / "mymodel" / "pytorch_model.bin")
    (home / "mymodel" / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(flag)))
    cli.refused(*rtn_args(home, home / "o"), match="safetensors only",
                case="model with only pytorch_model.bin")
    assert not flag.exists()


def test_unwritable_output_and_full_disk_are_found_before_work(
        cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal import fsio

    monkeypatch.setattr(fsio, "is_writable_dir", lambda _: False)  # root ignores chmod
    cli.refused(*gptq_args(home, home / "ro" / "o"), match="not a writable directory",
                case="-o in an unwritable directory (emulated: the test runs as root)")
    monkeypatch.undo()
    monkeypatch.setattr(fsio, "free_bytes", lambda _: 2**20)
    cli.refused(*gptq_args(home, home / "o"), match="not enough free space",
                case="-o on a disk without room, checked before work (emulated free space)")
    assert not (home / "o").exists() and not (home / "o.work").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_output_for_real(cli: Cli, home: Path) -> None:
    ro = home / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        cli.refused(*rtn_args(home, ro / "o"), match="not a writable directory",
                    case="-o in a chmod 555 directory")
    finally:
        ro.chmod(0o755)


def test_disk_filling_during_save_leaves_nothing(cli: Cli, home: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.packing import checkpoint

    def full(*_args, **_kwargs) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full)
    cli.refused(*rtn_args(home, home / "o"), match="the disk filled up",
                case="disk fills during the final save (emulated ENOSPC)")
    assert sorted(p.name for p in home.iterdir()) == ["calib.txt", "mymodel", "notes.txt"]


def test_truncated_work_file_on_resume(cli: Cli, home: Path) -> None:
    out = home / "ckpt"
    assert cli(*gptq_args(home, out, "--keep-work"))[0] == 0
    shutil.rmtree(out)
    hidden = Path(f"{out}.work") / "next_hidden.b0000.safetensors"
    hidden.write_bytes(hidden.read_bytes()[:100])
    line = cli.refused(*gptq_args(home, out, "--resume"), match="next_hidden.b0000.safetensors",
                       case="--resume with a truncated .work file")
    assert "--overwrite" in line
    assert cli(*gptq_args(home, out, "--overwrite"))[0] == 0  # the offered way to start over


def test_compare_restarts_a_cell_whose_work_file_is_corrupt(home: Path, tmp_path: Path) -> None:
    from qcal.grid import GridRunner, GridSpec

    spec = GridSpec(name="g", model=str(home / "mymodel"), selectors=("random",), methods=("gptq",),
                    group_size=32, source=str(home / "calib.txt"), nsamples=4, seqlen=32,
                    eval_seqlen=32, max_windows=2, eval_text_file=str(home / "calib.txt"))
    work = tmp_path / "w"
    cell_work = work / "ckpt" / "random__gptq.work"
    cell_work.mkdir(parents=True)
    (cell_work / "progress.json").write_text('{"done": 0, "fingerprint": "x"')  # truncated JSON
    cells = GridRunner(spec, tmp_path / "r", work, progress=False).run()
    assert "random__gptq" in cells and not cell_work.exists()


# --- 5. correctness and hygiene --------------------------------------------------------------

def test_nan_weights_are_refused_with_the_tensor_name(cli: Cli, home: Path) -> None:
    weights = home / "mymodel" / "model.safetensors"
    state = load_file(str(weights))
    state["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(state, str(weights), metadata={"format": "pt"})
    for argv, what in ((rtn_args(home, home / "o"), "quantize"),
                       (["eval", "--model", home / "mymodel", "--text", home / "calib.txt"], "eval")):
        cli.refused(*argv, match="model.layers.1.mlp.up_proj.weight", case=f"NaN in a float weight ({what})")
    assert not (home / "o").exists()


def test_eval_with_non_finite_result_exits_non_zero(cli: Cli, home: Path) -> None:
    weights = home / "mymodel" / "model.safetensors"
    state = load_file(str(weights))
    state["model.norm.weight"].fill_(3e38)  # finite weights whose logits overflow
    save_file(state, str(weights), metadata={"format": "pt"})
    out = home / "res"
    cli.refused("eval", "--model", home / "mymodel", "--text", home / "calib.txt", "--seqlen", "32",
                "-o", out, match="non-finite", case="eval whose perplexity is NaN/Inf")
    assert not list(home.glob("res*"))


@pytest.mark.parametrize(("field", "value", "match"), [
    ("selectors", "random,zipff", "unknown"),
    ("methods", "rtn,gptqq", "known"),
    ("group-size", "4096", "exceeds in_features"),
    ("eval", "ppl,no_such_task", "unknown lm-eval task"),
    ("eval-langs", "en,xx", "not in debian-handbook"),
])
def test_compare_validates_the_whole_grid_first(cli: Cli, home: Path, tmp_path: Path, field: str,
                                                value: str, match: str) -> None:
    if field == "eval-langs":
        from qcal.data import available_languages

        try:
            available_languages("debian-handbook")
        except Exception:  # noqa: BLE001
            pytest.skip("packaged corpus not provisioned")
    argv = ["compare", "--name", "g", "--model", home / "mymodel", "--selectors", "random",
            "--methods", "rtn,gptq", "--source", home / "calib.txt", "--nsamples", "4",
            "--seqlen", "32", "--group-size", "32", "--results-dir", tmp_path / "results"]
    if field != "eval-langs":
        argv += ["--eval-seqlen", "32", "--max-windows", "2"]
    i = argv.index(f"--{field}") if f"--{field}" in argv else None
    if i is None:
        argv += [f"--{field}", value]
    else:
        argv[i + 1] = value
    cli.refused(*argv, match=match, case=f"compare with a bad {field} ({value})")
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


def test_two_quantize_runs_on_one_output(cli: Cli, home: Path) -> None:
    out = home / "ckpt"
    work = Path(f"{out}.work")
    work.mkdir()
    (work / ".qcal-output.json").write_text('{"written_by": "qcal", "kind": "quantization work state"}')
    with open(work / ".lock", "a+") as held:  # as a running `qcal quantize` holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        cli.refused(*rtn_args(home, out), match="another `qcal quantize` is writing",
                    case="second quantize on the same -o while one runs")
    assert not out.exists()


def test_plain_rerun_after_a_kill_says_how_to_resume(cli: Cli, home: Path) -> None:
    out = home / "ckpt"
    assert cli(*gptq_args(home, out, "--keep-work"))[0] == 0
    shutil.rmtree(out)  # killed before the final save
    cli.refused(*gptq_args(home, out), match="add --resume to continue",
                case="plain rerun after a kill")
    assert cli(*gptq_args(home, out, "--resume"))[0] == 0


def test_ctrl_c_prints_the_resume_hint(cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal import pipeline

    def interrupted(*_a, **_k) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "quantize_model_dir", interrupted)
    rc, err = cli(*gptq_args(home, home / "ckpt"))
    assert rc == 130 and "--resume" in err
    cli.record("Ctrl-C during GPTQ", tuple(gptq_args(home, home / "ckpt")), rc, err.strip().splitlines()[-1])


def test_small_ones(cli: Cli, home: Path) -> None:
    nul = home / "nul.txt"
    nul.write_bytes(b"\x00" * 4096)
    cli.refused(*gptq_args(home, home / "o")[:-2], "--calib", nul, "-o", home / "o",
                match="binary file", case="NUL-only calibration text")
    cli.refused(*rtn_args(home, home / "o", "--selector", "zipf"), match="does not use",
                case="--selector with --method rtn")
    line = cli.refused("quantize", "--model", home / "mymodel", "--method", "gptq", "--calib",
                       home / "calib.txt", "--nsamples", "100000", "--seqlen", "32", "-o", home / "o",
                       match="--nsamples", case="more samples than the text holds (quantize)")
    assert "--n " not in line.replace("--n in", "")
    rc, err = cli("quantize", "--model", home / "mymodel", "--method", "gptq", "--calib",
                  home / "calib.txt", "--nsamples", "1", "--seqlen", "4096", "-o", home / "o")
    assert rc == 0 and "exceeds the model's max_position_embeddings=2048" in err  # warns, runs
    cli.record("--seqlen above max positions (warning)", ("quantize", "--seqlen", "4096"), rc,
               next(ln for ln in err.splitlines() if "warning" in ln))


def test_hessian_checks_are_specific() -> None:
    from qcal.errors import NumericalError
    from qcal.quant.hessian import inverse_cholesky

    h = torch.eye(4)
    h[1, 1] = -1.0
    with pytest.raises(NumericalError, match="negative diagonal"):
        inverse_cholesky(h, 0.01, "x")
