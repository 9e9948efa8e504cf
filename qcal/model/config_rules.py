"""A model folder's config.json checked before anything is built from it.

transformers builds a model from whatever config.json says: string numbers, zero or
negative sizes, heads that do not divide, an unknown activation or rope type fail deep
inside a module's constructor (exit 3 in qcal), and sizes far larger than the weights
allocate first and fail later (hidden_size 10^7 was OOM-killed at 20 GB; 10^6 layers took
minutes to build before anything was compared). Each is refused here in one line naming
the field and the fix, from the config dict and the weight files' headers alone:

- the sizes transformers reads are positive integers, heads divide as attention needs;
- dtype, activation and rope type are ones this transformers knows;
- the config class of `model_type` accepts the dict (its own validators run);
- hidden_size and vocab_size are dimensions of some stored tensor, and the files hold at
  least num_hidden_layers numbered blocks, so a config cannot ask for more than is stored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qcal.errors import ModelNotFoundError

SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
ACTIVATION_FIELDS = ("hidden_act", "hidden_activation", "activation_function")
DTYPE_FIELDS = ("dtype", "torch_dtype")
DTYPE_NAMES = frozenset({"float32", "float16", "bfloat16", "float64", "float", "half",
                         "double", "auto"})
NUMBERED = re.compile(r"\.(\d+)\.")
SHOWN_CHARS = 60


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _refuse(cfg: Path, problem: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"{cfg}: {problem}; restore the model's own config.json")


def _sections(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The config and its text model's config (multimodal configs nest the decoder's)."""
    nested = raw.get("text_config")
    return [raw, nested] if isinstance(nested, dict) else [raw]


def _check_sizes(cfg: Path, section: dict[str, Any]) -> None:
    for key in SIZE_FIELDS:
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refuse(cfg, f"{key} is {_shown(value)}, not a positive integer")
    heads, kv = section.get("num_attention_heads"), section.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise _refuse(cfg, f"num_attention_heads ({heads}) is not a multiple of "
                           f"num_key_value_heads ({kv})")
    hidden, head_dim = section.get("hidden_size"), section.get("head_dim")
    if heads is not None and hidden is not None and head_dim is None and hidden % heads:
        raise _refuse(cfg, f"hidden_size ({hidden}) is not a multiple of num_attention_heads "
                           f"({heads}) and no head_dim is given")


def _check_names(cfg: Path, section: dict[str, Any]) -> None:
    from transformers.activations import ACT2FN
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for key in DTYPE_FIELDS:
        value = section.get(key)
        if value is not None and (not isinstance(value, str) or value not in DTYPE_NAMES):
            raise _refuse(cfg, f"{key} is {_shown(value)}, not one of "
                               f"{', '.join(sorted(DTYPE_NAMES))}")
    for key in ACTIVATION_FIELDS:
        value = section.get(key)
        if value is not None and (not isinstance(value, str) or value not in ACT2FN):
            raise _refuse(cfg, f"{key} is {_shown(value)}, an activation transformers does "
                               "not have")
    rope_types = set(ROPE_INIT_FUNCTIONS) | {"default"}
    for params in _rope_parameter_sets(section):
        kind = params.get("rope_type", params.get("type", "default"))
        if not isinstance(kind, str) or kind not in rope_types:
            raise _refuse(cfg, f"rope_type {_shown(kind)} is not one of "
                               f"{', '.join(sorted(rope_types))}")


def _rope_parameter_sets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """rope settings, flat or per attention type (Gemma 3 keeps one set per layer type)."""
    out = []
    for key in ("rope_parameters", "rope_scaling"):
        value = section.get(key)
        if not isinstance(value, dict):
            continue
        if "rope_type" in value or "type" in value:
            out.append(value)
        else:
            out.extend(v for v in value.values() if isinstance(v, dict))
    return out


def _check_class(cfg: Path, raw: dict[str, Any]) -> None:
    """The config class's own rules (transformers' strict dataclass validators)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import CONFIG_MAPPING, __version__

    model_type = raw["model_type"]
    if model_type not in CONFIG_MAPPING:
        if raw.get("auto_map"):
            return  # the folder's own config class, allowed by --trust-remote-code
        raise _refuse(cfg, f"model_type {_shown(model_type)} is not an architecture "
                           f"transformers {__version__} knows (a newer transformers may)")
    try:
        CONFIG_MAPPING[model_type].from_dict(dict(raw))
    except (StrictDataclassError, ValueError, TypeError, KeyError, AttributeError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        problem = lines[-1] if lines else type(err).__name__
        raise _refuse(cfg, f"transformers' {CONFIG_MAPPING[model_type].__name__} refuses it "
                           f" ({problem[:200]})") from None


def _check_against_files(cfg: Path, section: dict[str, Any], folder: Path) -> None:
    """Sizes the stored tensors can have: no config asks for more than the files hold."""
    from qcal.model.consistency import file_tensors

    files = file_tensors(folder)
    dims = {d for _, shape, _ in files.values() for d in shape}
    for key in ("hidden_size", "vocab_size"):
        value = section.get(key)
        if value is not None and value not in dims:
            raise _refuse(cfg, f"{key} is {value}, but no tensor in the weight files has a "
                               "dimension of that size: the config does not belong to them")
    layers = section.get("num_hidden_layers")
    numbered = [int(n) for key in files for n in NUMBERED.findall(key)]
    if layers is not None and numbered and layers > max(numbered) + 1:
        raise _refuse(cfg, f"num_hidden_layers is {layers}, but the weight files number their "
                           f"blocks 0..{max(numbered)} only")


def check_config(folder: Path, raw: dict[str, Any]) -> None:
    """Refuse a config.json transformers would choke on, or one that asks for more than
    `folder`'s weight files hold, in one line naming the field."""
    cfg = Path(folder) / "config.json"
    sections = _sections(raw)
    for section in sections:
        _check_sizes(cfg, section)
        _check_names(cfg, section)
    _check_class(cfg, raw)
    if any(Path(folder).glob("*.safetensors")):
        _check_against_files(cfg, sections[-1], Path(folder))
