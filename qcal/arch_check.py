"""Does qcal quantize a given architecture correctly? One model, one method, four checks.

1. quantization (`qcal.run.quantize_model_dir`, stages 4 and 5 of `qcal quantize`) finishes;
2. no float linear or expert weight is left inside the checkpoint's decoder layers (norms,
   routers and the linears the ArchSpec keeps float aside);
3. the checkpoint loads back in qcal and its packed logits equal those of the same model
   with every QuantLinear replaced by a float linear holding its dequantized weight;
4. KL(float || quantized) per token on held-out text, for comparison across methods: a
   wrong AWQ fold or a skipped linear shows up as several times RTN's.

Used by tests/integration/test_architectures.py and `qcal report --study architectures`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from qcal.config import AWQConfig, GPTQConfig, QuantScheme, RTNConfig
from qcal.eval.divergence import compare_on_ids
from qcal.methods import RunOptions
from qcal.model.arch import decoder_layers
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.module_tree import get_module, set_module
from qcal.packing.qlinear import QuantLinear
from qcal.run import quantize_model_dir

METHOD_VARIANTS = ("rtn", "gptq", "gptq-act-order", "awq")


def method_config(variant: str, scheme: QuantScheme) -> tuple[str, Any]:
    if variant == "rtn":
        return "rtn", RTNConfig(scheme=scheme)
    if variant.startswith("gptq"):
        return "gptq", GPTQConfig(scheme=scheme, desc_act=variant.endswith("act-order"))
    return "awq", AWQConfig(scheme=scheme)


def text_ids(tokenizer: Any, texts: list[str], n: int, seqlen: int) -> torch.Tensor:
    """`n` windows of `seqlen` tokens cut from the texts, in order."""
    ids = tokenizer("\n\n".join(texts), return_tensors="pt")["input_ids"][0]
    if ids.numel() < n * seqlen:
        raise ValueError(f"{ids.numel()} tokens cannot fill {n} windows of {seqlen}")
    return ids[: n * seqlen].reshape(n, seqlen)


def float_weights_left(ckpt: Path, skeleton: nn.Module) -> list[str]:
    """Tensors of 2+ dims inside the decoder layers that a quantized linear should hold."""
    arch = arch_for(skeleton)
    linears = {f"{arch.layers_path}.{i}.{n}" for i in range(len(decoder_layers(skeleton, arch)))
               for n in arch.linear_names}
    left = []
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118
                owner, _, leaf = key.rpartition(".")
                if leaf == "weight" and owner in linears:
                    left.append(key)
                elif key.endswith(("gate_up_proj", "experts.down_proj")):
                    left.append(key)  # fused experts stored as float
    return left


@torch.no_grad()
def dequantized_copy(model: nn.Module) -> nn.Module:
    """The same model with each QuantLinear replaced by an nn.Linear of its dequantized
    weight: what fake quantization computes."""
    import copy

    twin = copy.deepcopy(model)
    for name, module in list(twin.named_modules()):
        if isinstance(module, QuantLinear):
            dtype = next((p.dtype for p in twin.parameters() if p.is_floating_point()), torch.float32)
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                               dtype=dtype)
            linear.weight.copy_(module.dequantized_weight(dtype))
            if module.bias is not None:
                linear.bias.copy_(module.bias.to(dtype))
            set_module(twin, name, linear)
    return twin


@dataclasses.dataclass
class ArchCheck:
    family: str
    method: str
    ok: bool
    error: str = ""
    linears_quantized: int = 0
    float_left: list[str] = dataclasses.field(default_factory=list)
    logit_diff: float = float("nan")
    kl: float = float("nan")
    format: str = ""
    transformers: str = ""  # "yes" when bare transformers loads it with qcal's logits, else why not


def check(model_dir: Path, family: str, variant: str, calib: torch.Tensor, held_out: torch.Tensor,
          scheme: QuantScheme, out_dir: Path | None = None) -> ArchCheck:
    """Quantize `model_dir` with `variant`, then run the checks above."""
    method, config = method_config(variant, scheme)
    # The default format, except act-order with per-column groups (g_idx), which only the GPTQ
    # layout stores (compressed-tensors would turn it into static groups).
    fmt = "gptq" if variant == "gptq-act-order" else "compressed-tensors"
    row = ArchCheck(family, variant, False, format=fmt)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(out_dir or tmp) / f"{family}-{variant}"
        try:
            quantize_model_dir(model_dir, method, config, out, calib_ids=calib,
                               opts=RunOptions(progress=False, log=lambda _: None), fmt=fmt)
        except Exception as err:  # the row records the failure; the caller decides
            row.error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            return row
        base, _, _ = load_model(model_dir)
        quant, _, _ = load_model(out)
        row.linears_quantized = sum(isinstance(m, QuantLinear) for m in quant.modules())
        row.float_left = float_weights_left(out, quant)
        with torch.no_grad():
            packed = quant(held_out[:1]).logits
            fake = dequantized_copy(quant)(held_out[:1]).logits
        row.logit_diff = float((packed - fake).abs().max() / fake.abs().max())
        drift = compare_on_ids(base, quant, held_out.reshape(-1), seqlen=held_out.shape[1],
                               progress=False)
        row.kl = float(drift.kl.mean())
        if fmt == "compressed-tensors":
            row.transformers = transformers_loads(out, held_out[:1], packed)
        row.ok = not row.float_left and row.logit_diff < 1e-3
    return row


@torch.no_grad()
def transformers_loads(ckpt: Path, ids: torch.Tensor, qcal_logits: torch.Tensor) -> str:
    """"yes" when a bare `AutoModelForCausalLM.from_pretrained` loads the checkpoint and gives
    qcal's logits (within the int4 kernels' rounding), else the first line of why not."""
    from transformers import AutoModelForCausalLM

    try:
        net = AutoModelForCausalLM.from_pretrained(str(ckpt))
        logits = net(ids).logits
    except Exception as err:  # recorded, not raised: the table says which loader fails
        return f"no: {type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
    diff = float((logits - qcal_logits).abs().max() / qcal_logits.abs().max())
    return "yes" if diff < 1e-2 else f"no: logits differ from qcal's by {diff:.1e}"


def layer_count(model: nn.Module) -> int:
    return len(decoder_layers(model, arch_for(model)))


__all__ = ["METHOD_VARIANTS", "ArchCheck", "check", "dequantized_copy", "float_weights_left",
           "get_module", "layer_count", "method_config", "text_ids"]
