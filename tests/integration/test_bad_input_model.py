"""Bad input, part 6: model files checked against their config before any weight is used
(qcal.model.consistency). No random initialisation ever, the tokenizer fits the embedding,
packed checkpoints are consistent, a checkpoint is not quantized twice. Each refusal exits 2
with one line and leaves no output behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_cases import Cli, rtn_args
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.integration
PATTERN = "4. Model files checked against their config"


def _config(model: Path, **changes: object) -> None:
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(changes)
    (model / "config.json").write_text(json.dumps(cfg))


def _weights(model: Path, edit) -> None:  # noqa: ANN001
    path = model / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt"})


def _eval(model: Path, home: Path) -> list:
    return ["eval", "--model", model, "--text", home / "calib.txt", "--seqlen", "32",
            "--max-windows", "1"]


def test_config_with_more_layers_than_the_weights(cli: Cli, home: Path) -> None:
    _config(home / "mymodel", num_hidden_layers=5)
    for argv, what in ((rtn_args(home, home / "o"), "quantize"), (_eval(home / "mymodel", home),
                                                                  "eval")):
        cli.refused(*argv, match="number their blocks 0..1 only", case=f"config num_hidden_layers: 5 "
                    f"over 2 layers of weights ({what})")
    assert not (home / "o").exists() and not Path(f"{home / 'o'}.work").exists()


def test_config_with_fewer_layers_than_the_weights(cli: Cli, home: Path) -> None:
    _config(home / "mymodel", num_hidden_layers=1)
    cli.refused(*rtn_args(home, home / "o"), match="would be ignored",
                case="config num_hidden_layers: 1 over 2 layers of weights")
    assert not (home / "o").exists()


def test_untied_config_without_lm_head(cli: Cli, home: Path) -> None:
    state = load_file(str(home / "mymodel" / "model.safetensors"))
    assert "lm_head.weight" not in state  # the tiny model ties its embeddings
    _config(home / "mymodel", tie_word_embeddings=False)
    cli.refused(*rtn_args(home, home / "o"), match="lm_head.weight",
                case="tie_word_embeddings: false without lm_head")
    assert not (home / "o").exists()


def test_integer_tensor_where_a_float_belongs(cli: Cli, home: Path) -> None:
    def to_int(state: dict) -> None:
        key = "model.layers.0.mlp.up_proj.weight"
        state[key] = state[key].to(torch.int32)

    _weights(home / "mymodel", to_int)
    cli.refused(*rtn_args(home, home / "o"), match="is stored as I32, not a float",
                case="an int32 tensor where a float weight belongs")


def test_weight_shape_that_the_config_does_not_make(cli: Cli, home: Path) -> None:
    cfg = json.loads((home / "mymodel" / "config.json").read_text())
    _config(home / "mymodel", intermediate_size=cfg["intermediate_size"] * 2)
    cli.refused(*rtn_args(home, home / "o"), match="config.json makes it",
                case="config intermediate_size that the weights do not have")


def test_tokenizer_larger_than_the_embedding(cli: Cli, home: Path) -> None:
    model = home / "mymodel"
    cfg = json.loads((model / "config.json").read_text())
    rows = cfg["vocab_size"] - 40
    _config(model, vocab_size=rows)
    _weights(model, lambda s: s.update({"model.embed_tokens.weight":
                                        s["model.embed_tokens.weight"][:rows].clone()}))
    for argv, what in ((rtn_args(home, home / "o"), "quantize"), (_eval(model, home), "eval")):
        cli.refused(*argv, match="would index past it",
                    case=f"tokenizer with more tokens than the embedding has rows ({what})")
    assert not (home / "o").exists()


def test_calibration_ids_out_of_range() -> None:
    from qcal.errors import ConfigError
    from qcal.model.consistency import check_token_ids

    emb = torch.nn.Module()
    emb.get_input_embeddings = lambda: torch.nn.Embedding(10, 2)  # type: ignore[assignment]
    check_token_ids(torch.tensor([[0, 9]]), emb, "calibration")
    for bad in (torch.tensor([[0, 10]]), torch.tensor([[-1, 3]])):
        with pytest.raises(ConfigError, match="embedding has 10 rows"):
            check_token_ids(bad, emb, "calibration")


def test_packed_checkpoint_consistency(cli: Cli, home: Path) -> None:
    ckpt = home / "ckpt"
    # The GPTQ layout: its packed tensors (g_idx, qzeros) are what this test tampers with.
    assert cli(*rtn_args(home, ckpt), "--format", "gptq")[0] == 0
    key = "model.layers.0.self_attn.q_proj.g_idx"

    bad = home / "bad-gidx"
    shutil.copytree(ckpt, bad)
    _weights(bad, lambda s: s[key].__setitem__(0, 999))
    cli.refused(*_eval(bad, home), match="holds group 999",
                case="checkpoint with a g_idx out of range")
    shapes = home / "bad-shape"
    shutil.copytree(ckpt, shapes)
    scales = key.replace("g_idx", "scales")
    _weights(shapes, lambda s: s.update({scales: s[scales][:1].clone()}))
    cli.refused(*_eval(shapes, home), match="packed tensors of model.layers.0.self_attn.q_proj "
                "disagree", case="checkpoint whose scales do not match its qweight")
    cli.refused("quantize", "--model", ckpt, "--group-size", "32", "-o", home / "again",
                match="is already a quantized checkpoint", case="quantize --model <a qcal checkpoint>")
    assert not (home / "again").exists()


def test_tokenizer_with_its_own_code_names_the_flag(cli: Cli, home: Path, tmp_path: Path) -> None:
    model = home / "mymodel"
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer",
                                                                            None]})
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    flag = tmp_path / "pwned"
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(flag)!r}).touch()\n")
    cli.refused("calib", "build", "--model", model, "--source", home / "calib.txt", "--n", "2",
                "--seqlen", "32", "-o", home / "set", match="--trust-remote-code",
                case="tokenizer_config.json auto_map (calib build)")
    cli.refused(*rtn_args(home, home / "o"), match="--trust-remote-code",
                case="tokenizer_config.json auto_map (quantize)")
    assert not flag.exists() and not (home / "set").exists()


def test_the_real_models_pass_the_checks(default_model_dir: Path) -> None:
    from qcal.model.consistency import check_model_files

    check_model_files(default_model_dir)


def test_compare_remote_code_refusal_names_no_missing_flag(cli: Cli, home: Path,
                                                           tmp_path: Path) -> None:
    model = home / "remote"
    shutil.copytree(home / "mymodel", model)
    _config(model, model_type="evilmodel", auto_map={"AutoConfig": "evil.EvilConfig"})
    line = cli.refused("compare", "--name", "g", "--model", model, "--methods", "rtn",
                       "--group-size", "32", "--results-dir", tmp_path / "results",
                       match="has no --trust-remote-code",
                       case="compare of a model with auto_map", pattern="5. Names and outputs: one rule")
    assert "unless you pass" not in line
