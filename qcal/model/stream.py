"""Models bigger than memory: a meta skeleton whose decoder layers come from disk one at a time.

`build_skeleton` builds the model from config.json with every parameter on the meta
device (no memory), then reads only what lives outside the decoder layers (embeddings,
final norm; the LM head only when asked) from the safetensors files. A quantizer then
materializes layer i from the files (`DiskWeights.load_into`, short-lived memory maps),
quantizes it, writes its packed state to the work directory (`write_layer_state`) and
sends it back to meta (`free_layer`): peak memory is one float layer, whatever the depth.
The finished checkpoint is assembled from those per-layer files, shard by shard
(qcal.model.shards), and the same files are the resume state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from qcal.errors import CheckpointError, ConfigError, ModelNotFoundError
from qcal.fsio import atomic_write_bytes
from qcal.model.arch import ArchSpec, set_module
from qcal.model.offload import DiskWeights
from qcal.packing.qlinear import QuantLinear

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str | int, option: str = "size") -> int:
    """'2GB', '500MiB', '1.5GB' or a plain byte count as bytes; one clear error otherwise."""


    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"{option} {text!r} is not a size; give e.g. 500MB, 2GB or 4GiB")
    return int(float(match.group(1)) * _UNITS[unit])


def layer_file(work_dir: Path, index: int) -> Path:
    return Path(work_dir) / f"layer_{index:04d}.safetensors"


def is_streamed(model: nn.Module) -> bool:
    """True when some weights still live on the meta device (a skeleton, or freed layers)."""
    return any(p.is_meta for p in model.parameters()) or any(
        b.is_meta for b in model.buffers())


def build_skeleton(path: Path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
                   with_head: bool = False, with_prelude: bool = True) -> nn.Module:
    """The model of `path` with decoder layers on meta and everything else read in `dtype`.

    `with_head=False` leaves an untied LM head on meta too: quantization never runs it;
    `with_prelude=False` leaves everything outside the layers on meta (RTN runs nothing)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True,
                                            trust_remote_code=trust_remote_code)
        # Buffers (rotary tables) stay real: they are computed, not stored.
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelNotFoundError(f"cannot load the model in {path}: {first[:300]}") from None
    model.config._name_or_path = str(path)  # what from_pretrained records (resume fingerprint)
    model.eval()
    from qcal.model.resolve import arch_for

    arch = arch_for(model)
    weights = DiskWeights(path)
    skip = () if with_head else ("lm_head.",)
    names = [n for n in outside_layer_names(model, arch)
             if with_prelude and not n.startswith(skip) and n in weights.files]
    weights.load_named(model, names)
    model.tie_weights()
    return model


def outside_layer_names(model: nn.Module, arch: ArchSpec) -> list[str]:
    """State-dict names of the tensors that belong to no decoder layer."""
    prefix = arch.layers_path + "."
    return [n for n in model.state_dict(keep_vars=True) if not n.startswith(prefix)]


def free_outside(model: nn.Module, arch: ArchSpec, on_disk: set[str] | dict[str, Any]) -> None:
    """Send the parameters outside the decoder layers that the files hold (embeddings, final
    norm, head) back to meta. Once layer 0's inputs are captured a streamed quantization
    never runs them again (an 8B embedding is 0.8 GB in float32), and the checkpoint reads
    them from the files. Tied parameters go together."""
    prefix = arch.layers_path + "."
    drop = {id(p) for n, p in model.named_parameters(remove_duplicate=False)
            if not n.startswith(prefix) and n in on_disk and not p.is_meta}
    metas: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for leaf, p in list(module._parameters.items()):
            if p is not None and id(p) in drop:
                if id(p) not in metas:
                    metas[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"),
                                                requires_grad=p.requires_grad)
                module._parameters[leaf] = metas[id(p)]


def free_layer(layers: nn.ModuleList, index: int) -> None:
    """Send a finished layer's tensors back to meta (its module types, e.g. QuantLinear, stay)."""
    layers[index] = layers[index].to("meta")


def write_layer_state(work_dir: Path, index: int, layer: nn.Module) -> None:
    """A finished layer as safetensors (+ which modules are QuantLinear): resume state and
    the source the checkpoint is assembled from. Never pickle."""
    quant = {n: [m.in_features, m.out_features, m.bits, m.group_size, m.bias is not None]
             for n, m in layer.named_modules() if isinstance(m, QuantLinear)}
    state = {k: v.detach().contiguous().cpu() for k, v in layer.state_dict().items()}
    atomic_write_bytes(layer_file(work_dir, index), save(state, metadata={"quant": json.dumps(quant)}))


class ResumeStateError(CheckpointError):
    """A per-layer state file of an interrupted run is missing, truncated or not qcal's."""


def read_state_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
            return {k: handle.get_tensor(k) for k in handle.keys()}, meta  # noqa: SIM118
    except (OSError, SafetensorError, ValueError) as err:
        raise ResumeStateError(
            f"resume state file {path} is missing or corrupted ({str(err).splitlines()[0]}); "
            "start over: run without --resume and with --overwrite"
        ) from None


def read_layer_state(layer: nn.Module, path: Path) -> None:
    """Load a `write_layer_state` file into `layer` (QuantLinear modules created as needed)."""
    state, meta = read_state_file(path)
    try:
        quant: dict[str, Any] = json.loads(meta.get("quant", "{}"))
        for name, (inf, outf, bits, group, bias) in quant.items():
            set_module(layer, name, QuantLinear(int(inf), int(outf), int(bits), int(group),
                                                bool(bias)))
        # assign: copying into memory-mapped float weights would make their pages resident.
        layer.load_state_dict(state, assign=True)
    except (ValueError, TypeError, RuntimeError, AttributeError) as err:
        raise ResumeStateError(
            f"resume state file {path} does not fit this model ({str(err).splitlines()[0]}); "
            "start over: run without --resume and with --overwrite"
        ) from None




def activation_budget(max_memory: int | None) -> int:
    """Bytes of calibration activations to keep in RAM: `max_memory`, or a quarter of the
    RAM available now (the rest is for the layer, its Hessians and the OS page cache)."""
    if max_memory is not None:
        return int(max_memory)
    import psutil

    return int(psutil.virtual_memory().available // 4)


def spill_to_disk(hidden: list[torch.Tensor], directory: Path) -> list[torch.Tensor]:
    """The same tensors, each now backed by a safetensors file in `directory` through a
    writable memory map: the OS pages them in and out, so RAM no longer bounds the
    calibration set, and in-place updates (run_layer's `copy_`) write through to the file."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i, h in enumerate(hidden):
        path = directory / f"spill.b{i:04d}.safetensors"
        path.write_bytes(save({"hidden": h.detach().contiguous().cpu()}))
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            start, end = json.loads(f.read(header_len))["hidden"]["data_offsets"]
        raw = np.memmap(path, dtype=np.uint8, mode="r+", offset=8 + header_len + start,
                        shape=(end - start,))
        out.append(torch.from_numpy(raw).view(h.dtype).view(h.shape))
    return out
