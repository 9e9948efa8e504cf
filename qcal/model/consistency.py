"""Model files checked against their config before any weight is used.

transformers fills a parameter that the weight files lack with random values and carries
on; a tokenizer larger than the embedding indexes past it on some text only; a packed
checkpoint with a `g_idx` out of range fails deep inside a kernel. Each is refused here
in one line naming the file, the tensor and the fix:

- every parameter of the architecture (the meta skeleton built from config.json) is in the
  safetensors files, tied weights counting once; no file tensor is left unused; shapes match
  and float parameters are stored as floats;
- the tokenizer's ids fit the embedding; calibration and evaluation ids are in range;
- a GPTQ-layout checkpoint's packed tensors agree with each other and g_idx is in range;
- an already-quantized checkpoint given as a float source is named as such.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from qcal_kernels.format import PACKABLE_BITS as PACKED_WIDTHS
from safetensors import SafetensorError, safe_open

from qcal.errors import CheckpointError, ConfigError, ModelNotFoundError, RemoteCodeError

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
# Buffers older checkpoints stored that today's models recompute (never a learned weight).
RECOMPUTED_SUFFIXES = ("rotary_emb.inv_freq", ".masked_bias", ".attn.bias")
SHOWN = 3


def file_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """{tensor name: (safetensors dtype, shape, file)} from the headers only (nothing read)."""
    out: dict[str, tuple[str, tuple[int, ...], Path]] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as handle:
                for key in handle.keys():  # noqa: SIM118
                    piece = handle.get_slice(key)
                    out[key] = (str(piece.get_dtype()), tuple(piece.get_shape()), f)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"weight file {f} is truncated or corrupted "
                                  f"({str(err).splitlines()[0][:200]}); restore it from the "
                                  "original model") from None
    return out


def _listed(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_weights_match_config(path: Path, trust_remote_code: bool = False) -> None:
    """Every parameter the config's architecture has is in the files (no random init), no
    file tensor is unused, shapes agree, floats are floats."""
    from qcal.model.shapes import skeleton

    path = Path(path)
    net = skeleton(path, trust_remote_code)
    files = file_tensors(path)
    if _converted_on_load(net):
        _check_sizes(net, files, path)
        return
    prefix = getattr(net, "base_model_prefix", "") or ""

    def find(name: str) -> str | None:
        for candidate in (name, name.removeprefix(prefix + "."), f"{prefix}.{name}"):
            if candidate in files:
                return candidate
        return None

    groups: dict[int, list[str]] = {}  # tied parameters share one tensor: one file entry each
    for name, param in net.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    params = dict(net.named_parameters(remove_duplicate=False))
    used: set[str] = set()
    missing = []
    for names in groups.values():
        found = [(n, find(n)) for n in names if find(n) is not None]
        if not found:
            missing.append(names[0])
            continue
        for name, key in found:
            used.add(key)
            dtype, shape, f = files[key]
            want = tuple(params[name].shape)
            if shape != want:
                raise CheckpointError(f"weight {key} in {f.name} has shape {list(shape)}, but "
                                      f"config.json makes it {list(want)}; the config does not "
                                      "belong to these weights: restore the matching config.json")
            if params[name].is_floating_point() and dtype not in FLOAT_DTYPES:
                raise CheckpointError(f"weight {key} in {f.name} is stored as {dtype}, not a "
                                      "float type; the file is not a float model: restore or "
                                      "re-convert it")
    if missing and _renamed_on_load(net, files, path):
        return
    if missing:
        raise ModelNotFoundError(
            f"{path}: {len(missing)} parameter(s) of the architecture in config.json are not in "
            f"the weight files ({_listed(missing)}); loading would fill them with random values. "
            "The config does not match the weights (e.g. num_hidden_layers, "
            "tie_word_embeddings): restore the model's own config.json")
    known = used | {find(n) or n for n, _ in net.named_buffers()}
    unused = [k for k in files if k not in known and not k.endswith(RECOMPUTED_SUFFIXES)]
    if unused and _renamed_on_load(net, files, path):
        return
    if unused:
        raise ModelNotFoundError(
            f"{path}: {len(unused)} tensor(s) in the weight files have no place in the "
            f"architecture of config.json ({_listed(unused)}) and would be ignored; restore the "
            "model's own config.json (e.g. num_hidden_layers)")


def _converted_on_load(net: torch.nn.Module) -> bool:
    """Whether transformers renames or fuses this model's tensors while loading (MoE experts
    stored per expert, fused into 3-D parameters in memory): file and module names differ."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return False
    # Mappings are registered by model type or by class name (GPT-NeoX's embed_out -> lm_head).
    return bool(get_checkpoint_conversion_mapping(getattr(net.config, "model_type", ""))
                or get_checkpoint_conversion_mapping(type(net).__name__))


def _renamed_on_load(net: torch.nn.Module, files: dict[str, tuple[str, tuple[int, ...], Path]],
                     path: Path) -> bool:
    """Names differ but transformers renames on load (a model's own key mapping, e.g. GPT-NeoX's
    `embed_out` as `lm_head`): accepted when the element counts agree exactly, which a missing
    layer or head would break."""
    if not _converted_on_load(net):
        return False
    _check_sizes(net, files, path)
    return True


def _check_sizes(net: torch.nn.Module, files: dict[str, tuple[str, tuple[int, ...], Path]],
                 path: Path) -> None:
    """Where names differ between files and modules, the element counts must still agree:
    a layer or a head missing from the files (random initialisation) changes the total."""
    import math

    want = sum(p.numel() for p in net.parameters())  # tied parameters counted once
    have = sum(math.prod(shape) for key, (_, shape, _) in files.items()
               if not key.endswith(RECOMPUTED_SUFFIXES))
    tied = getattr(net.config, "tie_word_embeddings", False)
    head = net.get_output_embeddings()
    if tied and head is not None and have == want + head.weight.numel():
        have = want  # a tied head stored twice
    if have != want:
        raise ModelNotFoundError(
            f"{path}: the weight files hold {have:,} values but the architecture in config.json "
            f"has {want:,} parameters; loading would leave some randomly initialised or unused. "
            "Restore the model's own config.json (e.g. num_hidden_layers, tie_word_embeddings)")


def check_packed_tensors(path: Path) -> None:
    """A GPTQ-layout checkpoint: qweight/qzeros/scales/g_idx of each layer agree in shape and
    g_idx names existing groups, before any kernel indexes with it."""
    path = Path(path)
    qcfg = json.loads((path / "config.json").read_text(encoding="utf-8")).get(
        "quantization_config") or {}
    if qcfg.get("quant_method") != "gptq":
        return  # other layouts are converted (and shape-checked) by the loader
    try:
        base_bits = int(qcfg["bits"])
    except (KeyError, TypeError, ValueError):
        return  # the loader names a missing or non-integer bits
    from qcal.packing.formats import dynamic_scheme

    files = file_tensors(path)
    for key in [k for k in files if k.endswith(".qweight")]:
        layer = key[: -len(".qweight")]
        try:  # GPTQModel's `dynamic` rules give a layer its own width (per-module schemes)
            bits = dynamic_scheme(qcfg.get("dynamic"), layer, base_bits, 0)[0]
        except (TypeError, ValueError, AttributeError):
            return  # the loader names a malformed `dynamic`
        packed = bits in PACKED_WIDTHS  # K codes fill K*bits/32 int32 words
        need = {s: f"{layer}.{s}" for s in ("scales", "qzeros", "g_idx")}
        absent = [n for n in need.values() if n not in files]
        if absent:
            raise CheckpointError(f"checkpoint {path} lacks {_listed(absent)} beside {key}; it is "
                                  "incomplete: re-create it with `qcal quantize`")
        rows, out_features = files[key][1]
        groups, scale_cols = files[need["scales"]][1]
        (in_features,) = files[need["g_idx"]][1] or (0,)
        zrows, zcols = files[need["qzeros"]][1]
        held = 32 * rows // in_features if in_features and rows else None
        if (packed and held in PACKED_WIDTHS and held != bits and scale_cols == out_features
                and zrows == groups and zcols * 32 == out_features * held):
            raise CheckpointError(
                f"checkpoint {path}: {layer} holds {held}-bit codes, but its config.json says "
                f"bits={bits}: the checkpoint does not match its config.json; fix config.json or "
                "re-create it with `qcal quantize`")
        if packed and (rows * 32 != in_features * bits or scale_cols != out_features
                       or zrows != groups or zcols * 32 != out_features * bits):
            raise CheckpointError(
                f"checkpoint {path}: the packed tensors of {layer} disagree (qweight "
                f"{[rows, out_features]}, scales {[groups, scale_cols]}, qzeros {[zrows, zcols]}, "
                f"g_idx [{in_features}] at {bits} bits); re-create it with `qcal quantize`")
        with safe_open(str(files[need["g_idx"]][2]), "pt") as handle:
            g_idx = handle.get_tensor(need["g_idx"])
        if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise CheckpointError(
                f"checkpoint {path}: {need['g_idx']} holds group {int(g_idx.max())} (or "
                f"{int(g_idx.min())}), but {layer} has {groups} groups (0..{groups - 1}); the "
                "file is corrupted: re-create it with `qcal quantize`")


def check_model_files(path: Path, trust_remote_code: bool = False) -> None:
    """Before any weight is used: a float model's files against its config, or a quantized
    checkpoint's packed tensors against each other."""
    from qcal.packing.checkpoint import is_quantized_checkpoint

    if is_quantized_checkpoint(path):
        check_packed_tensors(path)
    else:
        check_weights_match_config(path, trust_remote_code)


def embedding_rows(net: torch.nn.Module) -> int | None:
    emb = net.get_input_embeddings() if hasattr(net, "get_input_embeddings") else None
    return int(emb.num_embeddings) if emb is not None and hasattr(emb, "num_embeddings") else None


def check_tokenizer_fits(net: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """Every id the tokenizer can emit indexes a row of the embedding."""
    rows = embedding_rows(net)
    if rows is None or tokenizer is None:
        return
    size = len(tokenizer)
    if size > rows:
        raise ModelNotFoundError(
            f"the tokenizer in {path} has {size} tokens, but the model's embedding has {rows} "
            f"rows: ids {rows}..{size - 1} would index past it. The tokenizer belongs to another "
            "model: restore this model's own tokenizer files")


def check_token_ids(ids: torch.Tensor | None, net: torch.nn.Module, what: str) -> None:
    """Calibration or evaluation ids all index the embedding (a saved set built with another
    tokenizer does not)."""
    rows = embedding_rows(net)
    if ids is None or rows is None or not ids.numel():
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= rows:
        raise ConfigError(
            f"the {what} token ids run from {low} to {high}, but the model's embedding has "
            f"{rows} rows (0..{rows - 1}); they were made with another tokenizer: rebuild them "
            "with this model (e.g. `qcal calib build --model <this model>`)")


def check_tokenizer_code(path: Path, trust_remote_code: bool) -> None:
    """A tokenizer whose tokenizer_config.json maps to the directory's own Python (auto_map)
    needs the same explicit opt-in as such a model."""
    cfg = Path(path) / "tokenizer_config.json"
    if trust_remote_code or not cfg.is_file():
        return
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the tokenizer loader names an unreadable file
    auto_map = raw.get("auto_map") if isinstance(raw, dict) else None
    if not auto_map:
        return
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    name = raw.get("tokenizer_class")
    if isinstance(name, str) and tokenizer_class_from_name(name) is not None:
        return  # transformers' own class of that name is used; the directory's code is not
    if auto_map:
        classes = auto_map.get("AutoTokenizer", auto_map) if isinstance(auto_map, dict) else auto_map
        raise RemoteCodeError(f"the tokenizer in {path} needs its own Python code "
                              f"(tokenizer_config.json auto_map: {json.dumps(classes)[:120]})")


def refuse_quantized_source(path: Path) -> None:
    """`qcal quantize --model <checkpoint>`: say it is quantized already, and where from."""
    from qcal.packing.checkpoint import is_quantized_checkpoint

    if not is_quantized_checkpoint(path):
        return
    qcfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))[
        "quantization_config"]
    source = None
    log = Path(path) / "quant_log.json"
    if log.is_file():
        try:
            source = json.loads(log.read_text(encoding="utf-8")).get("source_model")
        except (OSError, ValueError, AttributeError):
            source = None
    bits = qcfg.get("bits") or "?"
    raise ConfigError(
        f"{path} is already a quantized checkpoint ({qcfg.get('quant_method')}, {bits}-bit); "
        "quantizing it again would compound the rounding: pass its float model as --model"
        + (f" ({source})" if source else ""))
