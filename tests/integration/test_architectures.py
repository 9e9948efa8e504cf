"""Any decoder-only family: the ArchSpec is resolved from the model, every family in
qcal.model.tiny.TINY_FAMILIES quantizes with RTN, GPTQ (plain and act-order) and AWQ, and
what cannot be resolved exactly is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from qcal.arch_check import METHOD_VARIANTS, check, text_ids
from qcal.config import QuantScheme
from qcal.model.adapters import LinearizedExperts, is_conv1d, is_fused_experts
from qcal.model.arch import LLAMA_LIKE, ScaleGroup
from qcal.model.layer_resolver import LayerResolver
from qcal.model.loading import load_tokenizer
from qcal.model.resolve import resolve_arch
from qcal.model.tiny import TINY_FAMILIES, build_tiny_family, stdlib_text
from qcal.model.twin import build_twin, layer0_inputs

pytestmark = pytest.mark.integration

FAMILIES = list(TINY_FAMILIES)
# The AWQ scale groups each family must get (by the op the scale folds into): post-norms
# (Gemma2's post_attention_layernorm, OLMo2's norms) and the MoE router's input never.
EXPECTED_GROUPS = {
    **{f: {"input_layernorm", "post_attention_layernorm", "mlp.up_proj"}
       for f in ("llama", "mistral", "qwen2", "qwen3", "stablelm", "granite")},
    "gemma2": {"input_layernorm", "pre_feedforward_layernorm", "mlp.up_proj"},
    "gemma3": {"input_layernorm", "pre_feedforward_layernorm", "mlp.up_proj"},
    "phi3": {"input_layernorm", "post_attention_layernorm"},
    "phi": {"input_layernorm"},
    "opt": {"self_attn_layer_norm", "final_layer_norm"},
    "gpt_neox": {"input_layernorm", "post_attention_layernorm"},
    "falcon": {"input_layernorm"},
    "gpt2": {"ln_1", "ln_2"},
    "olmo2": {"mlp.up_proj"},
    "mixtral": {"input_layernorm", *(f"mlp.experts.{i}.up_proj" for i in range(4))},
    "qwen3_moe": {"input_layernorm", *(f"mlp.experts.{i}.up_proj" for i in range(4))},
}


# GPT-2: transformers does not replace Conv1D in compressed-tensors checkpoints. MoE: the
# family test's AWQ export is asymmetric, whose experts transformers 5.24 decompresses
# without their zero points (symmetric MoE exports load: see the test further down).
BARE_TRANSFORMERS_CANNOT = {"gpt2", "mixtral", "qwen3_moe"}


def _config(family: str, **overrides):
    import transformers

    cls_name, kwargs = TINY_FAMILIES[family]
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        pytest.skip(f"transformers has no {cls_name}")
    return cls(**{"vocab_size": 512, "pad_token_id": 0, **kwargs, **overrides})


def _skeleton(config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_resolved_spec_covers_every_linear(family: str) -> None:
    net = _skeleton(_config(family))
    spec = resolve_arch(net)
    assert {g.prev_op for g in spec.scale_groups} == EXPECTED_GROUPS[family]
    layer = net.get_submodule(spec.layers_path)[0]
    found = set()
    for name, module in layer.named_modules():
        if is_fused_experts(module):
            found |= {f"{name}.{i}.{p}" for i in range(module.gate_up_proj.shape[0])
                      for p in ("gate_proj", "up_proj", "down_proj")}
        elif (isinstance(module, nn.Linear) or is_conv1d(module)) and ".experts." not in name:
            found.add(name)
    assert found == set(spec.linear_names) | set(spec.float_linears)
    assert (spec.norm_offset == 1.0) == family.startswith("gemma")
    assert spec.prelude_modules and spec.attention is not None


def test_llama_resolves_to_the_reference_spec() -> None:
    """What the default model's checkpoints were made with, field by field: the same spec
    means the same computation (the GQA v -> o group was skipped at run time before)."""
    spec = resolve_arch(_skeleton(_config("llama")))
    for field in ("layers_path", "sequential", "norm_offset", "awq_clip_skip", "attention",
                  "attention_norm"):
        assert getattr(spec, field) == getattr(LLAMA_LIKE, field), field
    reference = [g for g in LLAMA_LIKE.scale_groups if g.prev_op != "self_attn.v_proj"]
    assert list(spec.scale_groups) == reference
    assert set(spec.prelude_modules) <= set(LLAMA_LIKE.prelude_modules)


def _resolver(family: str) -> LayerResolver:
    twin = build_twin(_config(family), False)
    layers = twin.get_submodule("model.layers")
    reached = layer0_inputs(twin, layers)
    assert reached is not None
    args, kwargs, _ = reached
    return LayerResolver(layers[0], args, kwargs, family)


def _layers(net: nn.Module) -> str:
    return next(n for n, m in net.named_modules() if isinstance(m, nn.ModuleList))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_twin_is_small_and_resolves_the_same_spec(family: str) -> None:
    """The twin's vocabulary and MLP width are cut (an 8B model's full twin held 4.9 GB in
    float64), and the spec resolved from it equals the one from a full-size twin."""
    from qcal.model.resolve import _resolve
    from qcal.model.twin import MLP_WIDTHS, TWIN_VOCAB, TWIN_WIDTH

    big = _config(family, vocab_size=5000, pad_token_id=4999)
    for key in MLP_WIDTHS:
        if isinstance(getattr(big, key, None), int) or (key == "n_inner" and family == "gpt2"):
            setattr(big, key, 2 * TWIN_WIDTH)
    twin = build_twin(big, False)
    assert twin.get_input_embeddings().weight.shape[0] == TWIN_VOCAB
    assert big.vocab_size == 5000 and big.pad_token_id == 4999  # the model's config is untouched
    full = build_twin(big, False, shrink=False)

    def layer_size(net: nn.Module) -> int:
        return sum(p.numel() for p in net.get_submodule(_layers(net)).parameters())

    # Falcon names no MLP width (its MLP is 4 x hidden): only its vocabulary is cut.
    assert layer_size(twin) < layer_size(full) or family == "falcon"
    assert _resolve(big, False) == _resolve(big, False, shrink=False)


def test_the_fold_probe_rejects_a_wrong_fold() -> None:
    """Gemma2's post_attention_layernorm normalises the attention output: folding the MLP's
    scale there (what a Llama-like fallback did) changes the layer; so does forgetting the
    (1 + w) of its norms."""
    r = _resolver("gemma2")
    mlp = ("mlp.gate_proj", "mlp.up_proj")
    assert r._fold_is_exact(ScaleGroup("pre_feedforward_layernorm", mlp, "mlp"), 1.0)
    assert not r._fold_is_exact(ScaleGroup("post_attention_layernorm", mlp, "mlp"), 1.0)
    assert not r._fold_is_exact(ScaleGroup("pre_feedforward_layernorm", mlp, "mlp"), 0.0)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return stdlib_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_quantizes_with_every_method(family: str, tmp_path: Path, texts: list[str]) -> None:
    model_dir = build_tiny_family(family, tmp_path / family)
    tok = load_tokenizer(model_dir)
    calib, held = text_ids(tok, texts[:60], 8, 64), text_ids(tok, texts[60:], 2, 64)
    rows = {v: check(model_dir, family, v, calib, held, QuantScheme(bits=4, group_size=32))
            for v in METHOD_VARIANTS}
    for variant, row in rows.items():
        assert row.ok, (variant, row.error, row.float_left[:3], row.logit_diff)
        assert row.linears_quantized == rows["rtn"].linears_quantized > 0
    # A wrong fold or a skipped linear costs several times RTN's divergence; calibration
    # noise on a random 2-layer model stays well inside 1.5x.
    for variant in ("gptq", "gptq-act-order", "awq"):
        assert rows[variant].kl <= 1.5 * rows["rtn"].kl, (variant, rows[variant].kl, rows["rtn"].kl)
    # The default format loads in bare transformers with qcal's logits, except where
    # transformers cannot (results/architectures.md, BARE_TRANSFORMERS_CANNOT).
    if family not in BARE_TRANSFORMERS_CANNOT:
        assert rows["awq"].transformers == "yes", rows["awq"].transformers


def _qcal(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qcal", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_layers_of_different_structure_are_refused_in_one_line(tmp_path: Path) -> None:
    """Qwen3-MoE with decoder_sparse_step=2: layer 0 dense, layer 1 MoE."""
    from transformers import AutoModelForCausalLM

    config = _config("qwen3_moe", decoder_sparse_step=2)
    model_dir = build_tiny_family("llama", tmp_path / "m")  # for its tokenizer
    for f in model_dir.glob("*.safetensors"):
        f.unlink()
    AutoModelForCausalLM.from_config(config).save_pretrained(str(model_dir))
    out = tmp_path / "out"
    result = _qcal("quantize", "--model", str(model_dir), "--method", "rtn", "-o", str(out),
                   cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "qwen3_moe" in errors[0] and "layer 1" in errors[0]
    assert "Traceback" not in result.stderr and not out.exists()


def test_show_arch_prints_the_spec_without_quantizing(tmp_path: Path) -> None:
    model_dir = build_tiny_family("gpt2", tmp_path / "gpt2")
    result = _qcal("quantize", "--model", str(model_dir), "--show-arch", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "transformer.h" in result.stdout and "attn.c_attn" in result.stdout
    assert not (tmp_path / "runs").exists()


def _never_routed_mixtral(path: Path) -> Path:
    """Top-1 Mixtral whose expert 3 scores the mean of experts 0 and 1: never the top one."""
    from transformers import AutoModelForCausalLM

    build_tiny_family("mixtral", path)
    config = json.loads((path / "config.json").read_text())
    config["num_experts_per_tok"] = 1
    (path / "config.json").write_text(json.dumps(config))
    net = AutoModelForCausalLM.from_pretrained(str(path))
    with torch.no_grad():
        for layer in net.model.layers:
            w = layer.mlp.gate.weight
            w[3] = (w[0] + w[1]) / 2
    net.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("all_experts", [False, True])
def test_moe_experts_without_tokens(tmp_path: Path, texts: list[str], all_experts: bool) -> None:
    model_dir = _never_routed_mixtral(tmp_path / "mx")
    calib = tmp_path / "calib.txt"
    calib.write_text("\n\n".join(texts[:60]))
    out = tmp_path / "out"
    args = ["quantize", "--model", str(model_dir), "--method", "gptq", "--calib", str(calib),
            "--nsamples", "8", "--seqlen", "64", "-o", str(out)]
    result = _qcal(*args, *(["--moe-all-experts"] if all_experts else []), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    log = json.loads((out / "quant_log.json").read_text())
    assert all(counts[3] == 0 for counts in log["moe"]["routed_tokens"].values())
    fallback = set(log["moe"]["rtn_fallback"])
    expert3 = {f"model.layers.{i}.mlp.experts.3.{p}" for i in range(2)
               for p in ("gate_proj", "up_proj", "down_proj")}
    assert fallback == (set() if all_experts else expert3)
    from qcal.packing.naming import memory_namer

    to_memory = memory_namer("mixtral", "MixtralForCausalLM")  # the file has Mixtral's own names
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        keys = {to_memory(k) for k in handle.keys()}  # noqa: SIM118
    assert {f"{n}.weight_packed" for n in expert3} <= keys  # per-expert names, quantized either way
    assert not any(k.endswith("gate_up_proj") for k in keys)


def test_ignore_keeps_matching_linears_float(tmp_path: Path) -> None:
    from qcal.model.loading import load_model
    from qcal.packing.qlinear import QuantLinear

    model_dir = build_tiny_family("llama", tmp_path / "llama")
    out = tmp_path / "out"
    result = _qcal("quantize", "--model", str(model_dir), "--ignore", r"layers\.0\.mlp",
                   "--ignore", "o_proj$", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    net, _, _ = load_model(out)
    quant = {n for n, m in net.named_modules() if isinstance(m, QuantLinear)}
    assert not any(n.startswith("model.layers.0.mlp") or n.endswith("o_proj") for n in quant)
    assert "model.layers.1.mlp.down_proj" in quant
    assert isinstance(net.get_submodule("model.layers.0.mlp.down_proj"), nn.Linear)
    recipe = json.loads((out / "quant_log.json").read_text())["recipe"]
    assert recipe["modules"]["ignore"] == [r"layers\.0\.mlp", "o_proj$"]


def test_linearized_experts_route_all_keeps_the_output() -> None:
    """Calibrating every expert on every token does not change what the layer computes."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(_config("mixtral"))
    fused = net.model.layers[0].mlp.experts
    experts = LinearizedExperts.from_fused(fused)
    x = torch.randn(10, 64)
    idx = torch.randint(0, 4, (10, 2))
    w = torch.rand(10, 2)
    routed = experts(x, idx, w)
    experts.route_all = True
    assert torch.allclose(experts(x, idx, w), routed, atol=1e-6)


@pytest.mark.parametrize(("family", "expert_key"), [
    ("mixtral", "model.layers.0.block_sparse_moe.experts.1.w3.weight_packed"),
    ("qwen3_moe", "model.layers.0.mlp.experts.1.up_proj.weight_packed"),
])
def test_moe_checkpoint_uses_the_original_expert_names_and_loads_in_transformers(
        family: str, expert_key: str, tmp_path: Path) -> None:
    """Experts are stored under the names the model's own checkpoints use (transformers'
    conversion mapping, reversed: Mixtral's w1/w3/w2 under block_sparse_moe), so bare
    transformers fuses them back; qcal reads them back under its per-expert names.
    Symmetric only: transformers 5.24 drops zero points when it decompresses experts."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from qcal.model.loading import load_model

    model_dir = build_tiny_family(family, tmp_path / family)
    out = tmp_path / "out"
    result = _qcal("quantize", "--model", str(model_dir), "--method", "rtn", "--sym",
                   "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    with safe_open(str(out / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert expert_key in keys
    if family == "mixtral":
        assert not any(".mlp." in k for k in keys)
    ids = torch.arange(3, 30)[None]
    net, _, _ = load_model(out)
    bare = AutoModelForCausalLM.from_pretrained(str(out))
    with torch.no_grad():
        ours, theirs = net(ids).logits, bare(ids).logits
    assert float((ours - theirs).abs().max() / ours.abs().max()) < 1e-3


def test_disk_names_invert_for_every_family() -> None:
    """Every tensor name qcal writes loads back as itself (qcal.packing.naming)."""
    from transformers import AutoModelForCausalLM

    from qcal.model.adapters import adapt_modules
    from qcal.packing.naming import config_names, disk_namer, memory_namer

    for family in FAMILIES:
        config = _config(family)
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(config)
        config.architectures = [type(net).__name__]  # as save_pretrained records it
        adapt_modules(net)
        to_disk, to_memory = disk_namer(*config_names(config)), memory_namer(*config_names(config))
        for key in net.state_dict():
            assert to_memory(to_disk(key)) == key, (family, key, to_disk(key))


def test_a_conv1d_kept_float_is_refused_and_the_rest_is_checked(tmp_path: Path) -> None:
    """GPT-2's Conv1D can only be stored quantized: --ignore that keeps one float is refused in
    one line, before any work; a selection that quantizes every Conv1D passes."""
    from qcal.config import ModuleSelection
    from qcal.errors import ConfigError
    from qcal.model.loading import load_model
    from qcal.schemes import validate_scheme

    net, _, _ = load_model(build_tiny_family("gpt2", tmp_path / "gpt2"))
    scheme = QuantScheme(4, 32)
    validate_scheme(net, scheme, ModuleSelection(targets=(), ignore=()))
    with pytest.raises(ConfigError, match=r"transformer\.h\.0\.attn\.c_attn is a Conv1D"):
        validate_scheme(net, scheme, ModuleSelection(targets=(), ignore=(r".*\.0\.attn\.c_attn",)))
    with pytest.raises(ConfigError, match="leave no linear to quantize"):
        validate_scheme(net, scheme, ModuleSelection(targets=("nothing$",), ignore=()))
