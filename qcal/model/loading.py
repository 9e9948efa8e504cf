"""Loading float models and qcal/GPTQ checkpoints from local directories (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from qcal.errors import ModelNotFoundError
from qcal.paths import default_model_dir

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_model_dir(model: str | Path | None) -> Path:
    """The local directory of `model`; None means the embedded default model."""
    if model is None:
        path = default_model_dir()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"the default model is not provisioned at {path}; run `make setup` "
                "(or `python scripts/provision_models.py`)"
            )
        return path
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"model directory {path} does not exist; pass a local HF model directory "
            "(config.json + *.safetensors + tokenizer) or omit --model for the default model"
        )
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} has no config.json; it is not a Hugging Face model directory"
        )
    return path


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(f"no usable tokenizer in {path} ({err})") from None


def load_model(
    model: str | Path | None = None, dtype: str | torch.dtype | None = None
) -> tuple[nn.Module, Any, Path]:
    """(model in eval mode, tokenizer, directory). Quantized checkpoints load as QuantLinear."""
    from transformers import AutoModelForCausalLM

    from qcal.packing.checkpoint import is_quantized_checkpoint, load_checkpoint

    path = resolve_model_dir(model)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if is_quantized_checkpoint(path):
        net = load_checkpoint(path, dtype=torch_dtype)
    else:
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise ModelNotFoundError(f"{path} holds no weights (*.safetensors or *.bin)")
        net = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch_dtype or torch.float32, local_files_only=True
        )
    net.eval()
    return net, load_tokenizer(path), path
