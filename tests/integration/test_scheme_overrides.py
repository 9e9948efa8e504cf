"""Per-module schemes end to end: `qcal quantize --scheme-override` with RTN, GPTQ and AWQ
on a tiny Llama writes each linear at its own width and group size (compressed-tensors
config groups, GPTQModel's `dynamic`), qcal loads them back computing what the
fake-quantized weights compute, bare transformers loads the default export, and what
cannot be stored or never matches is refused before anything is loaded or written."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from qcal.cli import main
from qcal.config import QuantScheme
from qcal.model.loading import load_model
from qcal.model.tiny import stdlib_text
from qcal.module_tree import set_module
from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of, ct_groups, ct_layer_scheme
from qcal.quant.base import rtn_quantize

pytestmark = pytest.mark.integration
PROMPTS = torch.tensor([[5, 17, 99, 240, 3, 77, 12, 8, 150, 42, 9, 300],
                        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
# 8-bit down_proj, group 64 on q_proj, 2-bit gate_proj of layer 1 only, 3-bit up_proj;
# the rest 4-bit g32.
OVERRIDES = (r".*\.down_proj=bits:8", r".*\.q_proj=group:64", r".*\.1\.mlp\.gate_proj=bits:2",
             r".*\.up_proj=bits:3")


def expected(name: str) -> tuple[int, int]:
    if name.endswith("down_proj"):
        return 8, 32
    if name.endswith("q_proj"):
        return 4, 64
    if name.endswith("layers.1.mlp.gate_proj"):
        return 2, 32
    if name.endswith("up_proj"):
        return 3, 32
    return 4, 32


def _calib(tmp_path: Path) -> Path:
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:40]), encoding="utf-8")
    return text


def _quantize(model: Path, tmp_path: Path, method: str, out: Path, *extra: str) -> int:
    args = ["quantize", "--model", str(model), "--method", method, "--group-size", "32",
            *[a for o in OVERRIDES for a in ("--scheme-override", o)], *extra, "-o", str(out)]
    if method != "rtn":
        args += ["--calib", str(_calib(tmp_path)), "--nsamples", "4", "--seqlen", "32"]
    return main(args)


def _fake_quantized(model: nn.Module) -> nn.Module:
    """A copy whose QuantLinears are float linears holding their dequantized weights."""
    fake = copy.deepcopy(model)
    for name, layer in quant_modules(fake).items():
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(layer.dequantized_weight(torch.float32))
        set_module(fake, name, linear)
    return fake


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_each_linear_gets_its_own_scheme(tiny_model_dir: Path, tmp_path: Path,
                                         method: str) -> None:
    out = tmp_path / "ct"
    assert _quantize(tiny_model_dir, tmp_path, method, out) == 0
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    groups = ct_groups(qcfg)
    assert len(groups) == 5  # one config group per distinct scheme
    targets = sorted(t for g in groups for t in g[2])
    assert r"re:model\.layers\.\d+\.mlp\.down_proj$" in targets  # a kind of linear, as a regex
    assert "model.layers.1.mlp.gate_proj" in targets  # one linear of its kind: its own name
    from compressed_tensors.quantization import QuantizationConfig

    QuantizationConfig.model_validate(qcfg)  # the library's own model accepts what was written
    model = load_checkpoint(out)
    layers = quant_modules(model)
    assert len(layers) == 14
    for name, layer in layers.items():
        assert (layer.bits, layer.group_size) == expected(name), name
        assert ct_layer_scheme(groups, name) == expected(name), name
        codes = codes_of(layer).codes
        assert int(codes.max()) < 2 ** layer.bits
        if layer.bits == 8:  # really 8-bit codes, not 4-bit ones in an 8-bit container
            assert int(codes.max()) > 15
    with torch.no_grad():
        torch.testing.assert_close(model(PROMPTS).logits, _fake_quantized(model)(PROMPTS).logits,
                                   rtol=1e-4, atol=1e-4)
    log = json.loads((out / "quant_log.json").read_text())
    assert log["scheme_overrides"] == list(OVERRIDES)
    assert [o["pattern"] for o in log["recipe"]["modules"]["schemes"]] == \
        [o.split("=")[0] for o in OVERRIDES]
    card = (out / "README.md").read_text()
    assert "Per-module schemes" in card and OVERRIDES[0] in card
    assert "bare transformers 5.24 cannot load several asymmetric groups" in card
    if method == "awq":  # the saved search replays at the same per-module schemes
        assert main(["quantize", "--model", str(tiny_model_dir), "--method", "awq",
                     "--awq-artifact", str(out / "artifacts" / "awq_search.safetensors"),
                     "-o", str(tmp_path / "replay")]) == 0
        replay = quant_modules(load_checkpoint(tmp_path / "replay"))
        for name, layer in layers.items():
            assert torch.equal(codes_of(replay[name]).codes, codes_of(layer).codes), name
    if method == "rtn":  # the independent oracle: RTN of the float weight at each scheme
        floats, _, _ = load_model(tiny_model_dir)
        for name, layer in layers.items():
            weight = dict(floats.named_parameters())[f"{name}.weight"].detach()
            want = rtn_quantize(weight, QuantScheme(*expected(name)), name=name)
            assert torch.equal(codes_of(layer).codes.long(), want.codes.long()), name


def test_gptq_format_writes_dynamic_and_matches_compressed_tensors(tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    assert _quantize(tiny_model_dir, tmp_path, "gptq", tmp_path / "ct") == 0
    assert _quantize(tiny_model_dir, tmp_path, "gptq", tmp_path / "gptq", "--format", "gptq") == 0
    qcfg = json.loads((tmp_path / "gptq" / "quantize_config.json").read_text())
    assert (qcfg["bits"], qcfg["group_size"]) == (4, 32)
    assert qcfg["dynamic"] == {r"+:.*\.down_proj": {"bits": 8}, r"+:.*\.q_proj": {"group_size": 64},
                               r"+:.*\.1\.mlp\.gate_proj": {"bits": 2},
                               r"+:.*\.up_proj": {"bits": 3}}
    assert json.loads((tmp_path / "gptq" / "config.json").read_text())[
        "quantization_config"]["dynamic"] == qcfg["dynamic"]
    import qcal

    a, b = load_checkpoint(tmp_path / "ct"), qcal.load(tmp_path / "gptq")  # with its checks
    for name, layer in quant_modules(b).items():
        assert (layer.bits, layer.group_size) == expected(name), name
        ca, cb = codes_of(quant_modules(a)[name]), codes_of(layer)
        assert torch.equal(ca.codes, cb.codes) and torch.equal(ca.zeros, cb.zeros), name
    with torch.no_grad():
        torch.testing.assert_close(a(PROMPTS).logits, b(PROMPTS).logits, rtol=1e-3, atol=1e-3)
    # qcal export keeps the per-module schemes both ways.
    assert main(["export", "--model", str(tmp_path / "ct"), "--format", "gptq_v2",
                 "-o", str(tmp_path / "v2")]) == 0
    assert json.loads((tmp_path / "v2" / "quantize_config.json").read_text())["dynamic"] == \
        qcfg["dynamic"]
    assert main(["export", "--model", str(tmp_path / "v2"), "--format", "compressed-tensors",
                 "-o", str(tmp_path / "ct2")]) == 0
    assert main(["export", "--model", str(tmp_path / "ct"), "--format", "awq",
                 "-o", str(tmp_path / "awq")]) == 2  # one scheme per AWQ checkpoint
    assert not (tmp_path / "awq").exists()
    c = qcal.load(tmp_path / "ct2")
    for name, layer in quant_modules(c).items():
        assert torch.equal(codes_of(layer).codes, codes_of(quant_modules(a)[name]).codes), name


def test_bare_transformers_loads_the_default_export(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ct"
    assert _quantize(tiny_model_dir, tmp_path, "rtn", out, "--sym") == 0
    ours = load_checkpoint(out)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        a, b = ours(PROMPTS).logits, hf(PROMPTS).logits
    assert float((a - b).abs().max() / a.abs().max()) < 1e-3
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_python_api_and_skip(tiny_model_dir: Path, tmp_path: Path) -> None:
    import qcal

    model = qcal.quantize(str(tiny_model_dir), method="rtn", scheme={"bits": 4, "group_size": 32},
                          output=tmp_path / "api", scheme_overrides=[
                              r".*\.0\.self_attn\.o_proj=skip", r".*\.down_proj=bits:8"])
    layers = quant_modules(model)
    assert "model.layers.0.self_attn.o_proj" not in layers  # kept float
    assert isinstance(model.get_submodule("model.layers.0.self_attn.o_proj"), nn.Linear)
    assert {n: (q.bits, q.group_size) for n, q in layers.items() if "down_proj" in n} == {
        "model.layers.0.mlp.down_proj": (8, 32), "model.layers.1.mlp.down_proj": (8, 32)}


@pytest.mark.parametrize("extra, why", [
    (["--scheme-override", "x=bits:eight"], "whole number"),
    (["--scheme-override", "mlp.down_proj=bits:8"], "matches no quantized linear"),
    (["--scheme-override", ".*down_proj=bits:5"], "bits=5 is not supported"),
    (["--scheme-override", ".*down_proj=group:48"], "does not divide in_features=256"),
    (["--scheme-override", ".*down_proj=bits:8", "--format", "awq"], "one scheme for every"),
    (["--scheme-override", ".*down_proj=bits:8", "--targets", "self_attn"],
     "matches no quantized linear"),
    (["--scheme-override", ".*down_proj=bits:8", "--method", "awq", "--awq-artifact",
      "{model}/config.json"], "replays a search with the schemes it was made with"),
])
def test_refusals_come_before_any_work(tiny_model_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
                                       extra: list[str], why: str) -> None:
    import qcal.model.loading as loading
    import qcal.run as run

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the refusal")

    for module in (loading, run):
        monkeypatch.setattr(module, "load_model", no_load)
    out = tmp_path / "out"
    capsys.readouterr()
    extra = [e.replace("{model}", str(tiny_model_dir)) for e in extra]
    assert main(["quantize", "--model", str(tiny_model_dir), "--group-size", "32", *extra,
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(why, err), err
    assert len(err.splitlines()) == 1, err
    assert not out.exists() and not Path(f"{out}.work").exists()


def test_grid_key_reaches_the_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    from qcal.grid import GridRunner, GridSpec

    calib, evaluation = tmp_path / "calib.txt", tmp_path / "eval.txt"
    calib.write_text("\n\n".join(stdlib_text()[:60]), encoding="utf-8")
    evaluation.write_text("\n\n".join(stdlib_text()[60:80]), encoding="utf-8")
    spec = GridSpec(name="tiny", model=str(tiny_model_dir), selectors=("random",),
                    methods=("rtn",), group_size=32, source=str(calib), nsamples=2, seqlen=32,
                    eval_seqlen=32, max_windows=1, eval_text_file=str(evaluation),
                    scheme_overrides=(OVERRIDES[0],))
    GridRunner(spec, tmp_path / "r", tmp_path / "w", progress=False).run()
    ckpt = tmp_path / "w" / "ckpt" / "none__rtn"
    qcfg = json.loads((ckpt / "quantize_config.json").read_text())  # grids write the GPTQ layout
    assert qcfg["dynamic"] == {r"+:.*\.down_proj": {"bits": 8}}
    for name, layer in quant_modules(load_checkpoint(ckpt)).items():
        assert layer.bits == (8 if name.endswith("down_proj") else 4), name
