"""Loading float models and qcal/GPTQ checkpoints from local directories (offline).

Only safetensors weights are read (pickle-based `.bin` files can run code when
loaded), transformers never runs a model directory's own Python unless the caller
passes `trust_remote_code=True` (the CLI's `--trust-remote-code`), and a directory
is checked before anything heavy happens: readable config.json, complete weight
files, finite float weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from qcal.errors import CheckpointError, ModelNotFoundError, RemoteCodeError
from qcal.model.config_rules import check_config
from qcal.model.hub import parse_hub_id, snapshot_dir
from qcal.model.offload import check_finite as require_finite
from qcal.paths import PROVISIONED_MODELS, default_model_dir, models_dir

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CONFIG_MAX_BYTES = 4 << 20


def read_model_config(path: Path) -> dict[str, Any]:
    """config.json of a model directory as a dict; one clear error when it is unusable."""
    cfg = Path(path) / "config.json"
    if cfg.stat().st_size > CONFIG_MAX_BYTES:
        raise ModelNotFoundError(f"{cfg} is {cfg.stat().st_size:,} bytes; a model config is a "
                                 f"few kilobytes (at most {CONFIG_MAX_BYTES:,} are read): "
                                 "restore it from the original model")
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except RecursionError:
        raise ModelNotFoundError(f"{cfg} nests deeper than JSON readers allow; restore it from "
                                 "the original model") from None
    except UnicodeDecodeError:
        raise ModelNotFoundError(f"{cfg} is not UTF-8 text; restore it from the original "
                                 "model") from None
    except json.JSONDecodeError as err:
        raise ModelNotFoundError(f"{cfg} is not valid JSON (line {err.lineno}: {err.msg}); "
                                 "restore it from the original model") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ModelNotFoundError(f"{cfg} has no \"model_type\"; it is not a Hugging Face model "
                                 "config: restore it from the original model")
    return raw


def check_remote_code(path: Path, raw: dict[str, Any], trust_remote_code: bool) -> None:
    """A config that needs the directory's own Python is refused without the explicit opt-in."""
    from qcal.model.consistency import check_tokenizer_code

    check_tokenizer_code(path, trust_remote_code)
    if trust_remote_code or not raw.get("auto_map"):
        return
    from transformers import CONFIG_MAPPING

    if raw["model_type"] not in CONFIG_MAPPING:
        raise RemoteCodeError(f"{path} needs its own Python code (config.json auto_map, "
                              f"model_type {raw['model_type']!r})")


def _short_name_dir(model: str | Path) -> Path | None:
    """models/<name> for a bare name that is no path here (`--model gemma-3-270m`)."""
    name = str(model)
    if Path(name).exists() or not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    path = models_dir() / name
    if (path / "config.json").is_file():
        return path
    if name in PROVISIONED_MODELS:
        raise ModelNotFoundError(
            f"model {name} is not provisioned at {path}; run `qcal provision --only model "
            f"--models {name}` (or set QCAL_HOME to the folder that holds models/)"
        )
    return None


def check_plain_files(folder: Path) -> None:
    """Every file of a model folder must be a regular file (links to one are fine, as in the
    Hub cache): a FIFO or a device would block the first read forever, and a dangling or
    looping link fails deep inside a loader. Checked by stat alone, nothing is opened."""
    import stat

    if not folder.is_dir():
        raise ModelNotFoundError(f"{folder} is not a directory; pass a Hugging Face model folder")
    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode  # follows links
        except FileNotFoundError:
            raise ModelNotFoundError(f"{entry} is a broken link; restore the file it points to "
                                     "or remove the link") from None
        except OSError as err:
            raise ModelNotFoundError(f"{entry} cannot be read ({err.strerror}: a link loop?); "
                                     "replace it with the file itself") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) \
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"
            raise ModelNotFoundError(f"{entry} is {kind}, not a regular file; a model folder "
                                     "holds plain files only: replace it with the file itself")


def resolve_model_dir(model: str | Path | None, trust_remote_code: bool = False) -> Path:
    """The local directory of `model` (None: the embedded default model; a bare name such as
    gemma-3-270m: models/<name> when no such path exists here), checked."""
    if model is not None:
        model = _short_name_dir(model) or model
    if model is None:
        path = default_model_dir()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"the default model is not provisioned at {path}; run `make setup` in the qcal "
                "checkout (or `qcal provision`), set QCAL_HOME to the folder "
                "that holds models/, or pass --model DIR"
            )
    else:
        path = Path(model).expanduser()
        if not path.exists() and parse_hub_id(str(model)) is not None:
            path = snapshot_dir(str(model))  # a Hub id: the cached (or downloaded) snapshot
        if not path.exists():
            raise ModelNotFoundError(
                f"model directory {path} does not exist; pass a local HF model directory "
                "(config.json + *.safetensors + tokenizer), a Hub id (org/name), the name of one under "
                f"{models_dir()} or omit --model for the default model"
            )
        check_plain_files(path)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} has no config.json; it is not a Hugging Face model directory"
            )
    raw = read_model_config(path)
    check_remote_code(path, raw, trust_remote_code)
    if not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickled:
            raise ModelNotFoundError(
                f"{path} holds only pickle weights ({', '.join(pickled[:3])}); qcal loads "
                "safetensors only, because pickle files can run code: convert them once, in an "
                "environment you trust, with `AutoModelForCausalLM.from_pretrained(dir)"
                ".save_pretrained(dir, safe_serialization=True)`"
            )
        raise ModelNotFoundError(f"{path} holds no weights (*.safetensors)")
    check_weight_set(path)
    check_config(path, raw)
    return path


def check_weight_set(folder: Path) -> None:
    """The folder's weights must be one unambiguous set, the one transformers loads: the
    shards its index names (all present), or model.safetensors alone. A stray extra
    safetensors file would otherwise be read by qcal and not by transformers."""
    index = folder / "model.safetensors.index.json"
    present = {f.name for f in folder.glob("*.safetensors")}
    if index.is_file():
        try:
            named = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise ModelNotFoundError(f"{index} is not a safetensors index (JSON with a "
                                     "weight_map); restore it from the original model") from None
        if not all(isinstance(n, str) for n in named):
            raise ModelNotFoundError(f"{index} names shards that are not file names; restore it")
        missing, stray = sorted(named - present), sorted(present - named)
        if missing:
            raise ModelNotFoundError(f"{index} names {missing[0]}, which {folder} lacks; restore "
                                     "the missing shard")
        if stray:
            raise ModelNotFoundError(f"{folder / stray[0]} is not in {index.name}: transformers "
                                     "loads only the indexed shards; move it out of the folder")
    elif present != {"model.safetensors"}:
        extra = sorted(present - {"model.safetensors"})
        what = (f"{extra[0]} besides model.safetensors" if "model.safetensors" in present
                else f"{extra[0]} but no model.safetensors" if len(present) == 1
                else f"{len(present)} safetensors files and no model.safetensors.index.json")
        raise ModelNotFoundError(f"{folder} holds {what}: transformers would load "
                                 "model.safetensors alone (or an index naming the shards); "
                                 "move the others out of the folder")


def check_weight_files(path: Path, check_finite: bool = True) -> int:
    """Open every safetensors file of `path` (one tensor at a time, so memory stays small);
    a truncated file or a NaN/Inf float weight is an error naming it. Returns total bytes."""
    total = 0
    for f in sorted(Path(path).glob("*.safetensors")):
        total += f.stat().st_size
        try:
            with safe_open(str(f), "pt") as handle:
                keys = list(handle.keys())  # noqa: SIM118
            for key in keys if check_finite else ():
                # One short-lived mapping per tensor: pages touched by the check are
                # unmapped again at once, so the whole file never counts in the peak RSS.
                with safe_open(str(f), "pt") as handle:
                    t = handle.get_tensor(key)
                require_finite(t, key, f)
                del t
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"weight file {f} is truncated or corrupted ({str(err).splitlines()[0]}); "
                "restore it from the original model"
            ) from None
    return total


def check_memory_fits(path: Path, dtype: torch.dtype) -> None:
    """A whole-model load needs about its tensors' elements at `dtype` (floats; packed codes
    as stored): refused before allocating when the machine has not that much available (an
    eval of a model bigger than RAM was OOM-killed after minutes instead)."""
    import math

    import psutil

    from qcal.model.consistency import FLOAT_DTYPES, file_tensors

    width = torch.empty(0, dtype=dtype).element_size()
    stored = {"I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
    need = sum(math.prod(shape) * (width if kind in FLOAT_DTYPES else stored.get(kind, 4))
               for kind, shape, _ in file_tensors(path).values())
    have = psutil.virtual_memory().available
    if need > have:
        raise ModelNotFoundError(
            f"loading {path} whole needs about {need / 2**30:.1f} GiB ({dtype}), and this "
            f"machine has {have / 2**30:.1f} GiB available: use a machine with more memory "
            "(`qcal quantize` streams a model one layer at a time and needs far less)")


def load_tokenizer(path: Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                             trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001  (tokenizers raises bare Exception for a bad file)
        first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise ModelNotFoundError(f"no usable tokenizer in {path} ({first}); restore the "
                                 "model's tokenizer files") from None


def load_model(
    model: str | Path | None = None, dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False, check: bool = True, stream: bool = False,
    prelude: bool = True, tokenizer: Any = None,
) -> tuple[nn.Module, Any, Path]:
    """(model in eval mode, tokenizer, directory). Quantized checkpoints load as QuantLinear.

    `check` reads every weight file once first (truncation, NaN/Inf) so a bad file gives
    one clear error instead of a traceback or a silently wrong result. `stream` (float
    models only) returns a skeleton whose decoder layers stay on the meta device, to be
    read from the files one at a time (qcal.model.stream); `prelude=False` leaves the
    embeddings on meta too (for methods that run no forward pass). `tokenizer`: one the
    caller already loaded from this directory, used instead of reading it again."""
    from transformers import AutoModelForCausalLM

    from qcal.model import consistency
    from qcal.model.offload import fix_heap_thresholds
    from qcal.packing.checkpoint import is_quantized_checkpoint
    from qcal.packing.checkpoint_load import load_checkpoint

    path = resolve_model_dir(model, trust_remote_code)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    # Every route to a model passes here: from now on big tensors freed go back to the
    # system (qcal.model.offload.return_freed_memory says why), which a layer-by-layer load
    # or quantization relies on.
    fix_heap_thresholds()
    if check:
        check_weight_files(path)
        consistency.check_model_files(path, trust_remote_code)  # no random init, sane packing
    if not stream:
        check_memory_fits(path, torch_dtype or torch.float32)
    if is_quantized_checkpoint(path):
        from qcal.model.adapters import adapt_modules

        # Conv1D and fused MoE experts as the per-name linears the checkpoint stores (no
        # resolution needed: the files say which linears are quantized).
        net = load_checkpoint(path, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                              prepare=adapt_modules)
    elif stream:
        from qcal.model.stream import build_skeleton

        net = build_skeleton(path, torch_dtype or torch.float32, trust_remote_code,
                             with_prelude=prelude)
    else:
        try:
            net = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=torch_dtype or torch.float32, local_files_only=True,
                use_safetensors=True, trust_remote_code=trust_remote_code,
            )
        except (OSError, ValueError, KeyError, RuntimeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelNotFoundError(f"cannot load the model in {path}: {first[:300]}") from None
    net.eval()
    if tokenizer is None:
        tokenizer = load_tokenizer(path, trust_remote_code)
    consistency.check_tokenizer_fits(net, tokenizer, path)
    return net, tokenizer, path
