"""A model folder's config.json (issue 52): every value transformers would choke on, or that
asks for more than the weight files hold, is refused in one line naming the field, before any
module is built (these were exit-3 internal errors, an OOM kill at hidden_size 10^7 and
minutes of building at 10^6 layers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_cases import Cli, within

pytestmark = pytest.mark.integration
PATTERN = "9. config.json validated against transformers' rules and the files (issue 52)"

CASES = [
    ("string number", {"hidden_size": "128"}, "hidden_size is '128', not a positive integer"),
    ("zero size", {"intermediate_size": 0}, "intermediate_size is 0, not a positive integer"),
    ("negative layers", {"num_hidden_layers": -1}, "num_hidden_layers is -1"),
    ("boolean size", {"num_attention_heads": True}, "num_attention_heads is True"),
    ("kv heads not dividing", {"num_key_value_heads": 3}, "is not a multiple of "
                                                          "num_key_value_heads (3)"),
    ("heads not dividing", {"num_attention_heads": 6, "num_key_value_heads": 2,
                            "head_dim": None}, "hidden_size (128) is not a multiple of "
                                               "num_attention_heads (6)"),
    ("unknown model_type", {"model_type": "llamaxx"}, "model_type 'llamaxx' is not an "
                                                      "architecture transformers"),
    ("unknown dtype", {"dtype": "float7"}, "dtype is 'float7', not one of"),
    ("unknown rope type", {"rope_parameters": {"rope_type": "weird", "rope_theta": 1.0}},
     "rope_type 'weird' is not one of"),
    ("unknown activation", {"hidden_act": "swooshy"}, "hidden_act is 'swooshy'"),
    ("a megabyte-long value", {"hidden_act": "x" * 1_000_000}, "'xxxxxxxx"),
    ("hidden_size 10^7", {"hidden_size": 10**7}, "hidden_size is 10000000, but no tensor"),
    ("num_hidden_layers 10^6", {"num_hidden_layers": 10**6}, "number their blocks 0..1 only"),
    ("vocab larger than the embedding", {"vocab_size": 1024}, "vocab_size is 1024, but no "
                                                              "tensor"),
]


def _quantize(model: Path, out: Path) -> list:
    return ["quantize", "--model", model, "--group-size", "32", "-o", out]


def _with_config(home: Path, name: str, text: str) -> Path:
    model = home / name
    shutil.copytree(home / "mymodel", model)
    (model / "config.json").write_text(text)
    return model


@pytest.mark.parametrize(("case", "changes", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_config_values_are_refused_before_any_work(cli: Cli, home: Path, case: str,
                                                       changes: dict, match: str) -> None:
    cfg = json.loads((home / "mymodel" / "config.json").read_text())
    model = _with_config(home, "m", json.dumps({**cfg, **changes}))
    out = home / "o"

    with within(60, "qcal built the model before checking its config"):
        line = cli.refused(*_quantize(model, out), match=match, case=f"config.json: {case}")
        cli.refused("eval", "--model", model, "--ppl", match=match,
                    case=f"eval: config.json {case}")
    assert len(line) < 400, "a value shown in full"
    assert not out.exists() and not Path(f"{out}.work").exists()


@pytest.mark.parametrize(("case", "text", "match"), [
    ("nested 100,000 deep", '{"a":' * 100_000 + "1" + "}" * 100_000, "nests deeper"),
    ("over 4 MiB", json.dumps({"model_type": "llama", "pad": "x" * (5 << 20)}),
     "a model config is a few kilobytes"),
])
def test_unreadable_config_is_refused(cli: Cli, home: Path, case: str, text: str,
                                      match: str) -> None:
    model = _with_config(home, "m", text)
    cli.refused(*_quantize(model, home / "o"), match=match, case=f"config.json {case}")
    assert not (home / "o").exists()


def test_a_model_bigger_than_the_memory_is_refused_before_loading(
        cli: Cli, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import psutil

    weights = (home / "mymodel" / "model.safetensors").stat().st_size
    small = types.SimpleNamespace(available=weights // 2, total=weights // 2)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: small)
    cli.refused("eval", "--model", home / "mymodel", "--text", home / "calib.txt", "--seqlen",
                "32", match="GiB available: use a machine with more memory",
                case="eval of a model larger than the memory available (OOM-killed)")


@pytest.mark.parametrize(("fmt", "edit", "match"), [
    ("compressed-tensors", {"config_groups": [1, 2]}, "not a valid compressed-tensors config"),
    ("gptq", {"group_size": -7}, "says group_size=-7"),
    ("gptq", {"group_size": 0}, "says group_size=0"),
])
def test_a_checkpoint_whose_quantization_config_is_malformed(cli: Cli, home: Path, fmt: str,
                                                             edit: dict, match: str) -> None:
    ckpt = home / "ckpt"
    rc, err = cli(*_quantize(home / "mymodel", ckpt), "--format", fmt)
    assert rc == 0, err
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"].update(edit)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    cli.refused("eval", "--model", ckpt, "--text", home / "calib.txt", "--seqlen", "32",
                match=match, case=f"eval of a {fmt} checkpoint with quantization_config {edit} "
                                  "(exit 3 before)")
