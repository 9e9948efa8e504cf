"""Bad input and faults on the tiny model, part 2: one clear line instead of a traceback,
correctness and hygiene. Each refusal exits 2 with one line naming problem and fix, and
nothing outside the output is touched or left behind.

`qcal report --study reliability` runs both parts (test_bad_input_safety.py,
test_bad_input_errors.py) and turns each case's recorded outcome into results/reliability.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_cases import Cli, Payload, gptq_args, rtn_args
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.integration


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
    assert cli(*rtn_args(home, ckpt, "--format", "gptq"))[0] == 0
    cfg = json.loads((ckpt / "config.json").read_text())
    for bits, match in ((8, "does not match its config.json"),
                        (5, "checkpoints hold (2, 3, 4, 8)-bit weights")):
        cfg["quantization_config"]["bits"] = bits
        (ckpt / "config.json").write_text(json.dumps(cfg))
        cli.refused("eval", "--model", ckpt, "--text", home / "calib.txt", match=match,
                    case=f"checkpoint config says bits={bits}, tensors are 4-bit")
    ct = home / "ct"  # the default format: fewer bits would read a prefix of the words
    assert cli(*rtn_args(home, ct))[0] == 0
    cfg = json.loads((ct / "config.json").read_text())
    for bits in (2, 8):
        cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = bits
        (ct / "config.json").write_text(json.dumps(cfg))
        cli.refused("eval", "--model", ct, "--text", home / "calib.txt",
                    match="does not match its config.json",
                    case=f"compressed-tensors config says {bits}-bit, tensors are 4-bit")


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


@pytest.mark.parametrize("raised", ["OSError", "SafetensorError"])
def test_disk_filling_during_save_leaves_nothing(cli: Cli, home: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 raised: str) -> None:
    from safetensors import SafetensorError

    from qcal.packing import checkpoint

    def full(*_args, **_kwargs) -> None:
        if raised == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device")
        # what the safetensors writer raised on a real full disk (exit 3 before)
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")

    monkeypatch.setattr(checkpoint, "save_file", full)
    line = cli.refused(*rtn_args(home, home / "o"), match="the disk filled up",
                       case=f"disk fills during the final save (emulated, {raised})")
    assert "o.work keeps the finished layers: run the same command with --resume" in line
    # No output; the finished layers stay in o.work for --resume (RTN streams, issue 36).
    assert sorted(p.name for p in home.iterdir()) == ["calib.txt", "mymodel", "notes.txt", "o.work"]


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


def test_eval_with_non_finite_result_exits_non_zero(cli: Cli, home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Weights within float16's range cannot make a float32 forward overflow any more (larger
    # ones are refused before loading, below): a model whose computation yields NaN stands in.
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    forward = LlamaForCausalLM.forward

    def nan_logits(self: LlamaForCausalLM, *args: object, **kwargs: object) -> object:
        out = forward(self, *args, **kwargs)
        out.logits.fill_(float("nan"))
        return out

    monkeypatch.setattr(LlamaForCausalLM, "forward", nan_logits)
    out = home / "res"
    cli.refused("eval", "--model", home / "mymodel", "--text", home / "calib.txt", "--seqlen", "32",
                "-o", out, match="non-finite", case="eval whose perplexity is NaN/Inf")
    assert not list(home.glob("res*"))


def test_weights_beyond_float16_are_refused_before_any_work(cli: Cli, home: Path) -> None:
    weights = home / "mymodel" / "model.safetensors"
    state = load_file(str(weights))
    state["model.layers.0.mlp.down_proj.weight"][0, 0] = 3e38  # finite: scales would be Inf
    save_file(state, str(weights), metadata={"format": "pt"})
    for argv, what in ((("quantize", "--model", home / "mymodel", "--group-size", "32", "-o",
                         home / "o"), "quantize"),
                       (("eval", "--model", home / "mymodel", "--text", home / "calib.txt",
                         "--seqlen", "32", "-o", home / "res"), "eval")):
        cli.refused(*argv, match="beyond the range of float16",
                    case=f"a finite weight of 3e38 ({what}: its scales were all Inf, exit 0)")
    assert not (home / "o").exists() and not list(home.glob("res*"))


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
    from qcal import run

    def interrupted(*_a, **_k) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "quantize_layers", interrupted)
    rc, err = cli(*gptq_args(home, home / "ckpt"))
    assert rc == 130 and "--resume" in err
    cli.record("Ctrl-C during GPTQ", tuple(gptq_args(home, home / "ckpt")), rc, err.strip().splitlines()[-1])


def test_small_ones(cli: Cli, home: Path) -> None:
    nul = home / "nul.txt"
    nul.write_bytes(b"\x00" * 4096)
    args = gptq_args(home, home / "o")
    args[args.index("--calib") + 1] = nul
    cli.refused(*args,
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


def test_resume_and_overwrite_together_are_refused(cli: Cli, home: Path) -> None:
    out = home / "both"
    cli.refused(*rtn_args(home, out, "--resume", "--overwrite"), match="pass one of them",
                case="--resume with --overwrite (one was silently ignored)")
    assert not out.exists() and not Path(f"{out}.work").exists()
