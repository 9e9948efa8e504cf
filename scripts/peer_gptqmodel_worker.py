"""Runs inside GPTQModel's own virtualenv (no qcal import): quantize, or score a checkpoint.

Called by scripts/bench_peers.py; every input comes from files it wrote, every
output goes to a JSON file it reads.

    python peer_gptqmodel_worker.py quantize MODEL_DIR CALIB_IDS.pt OUT_DIR RESULT.json \
        [--sym] [--desc-act] [--group G]
    python peer_gptqmodel_worker.py ppl CHECKPOINT_DIR EVAL_WINDOWS.pt RESULT.json
    python peer_gptqmodel_worker.py hf-ppl CHECKPOINT_DIR EVAL_WINDOWS.pt RESULT.json
(hf-ppl loads through transformers' GPTQ integration, which needs optimum.)
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any


def quantize(model_dir: str, calib_path: str, out_dir: str, result: str, sym: bool,
             desc_act: bool = False, group: int = 128) -> None:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from safetensors.torch import load_file

    ids = load_file(calib_path)["ids"]
    calib = [{"input_ids": row.tolist(), "attention_mask": [1] * row.numel()} for row in ids]
    # Matched to qcal's settings: plain GPTQ (act-order only when asked), no group-aware
    # reordering (a GPTQModel extension qcal does not have).
    cfg = QuantizeConfig(bits=4, group_size=group, sym=sym, desc_act=desc_act, act_group_aware=False,
                         damp_percent=0.01)
    started = time.perf_counter()
    # float32 like qcal (GPTQModel's CPU default is bfloat16).
    model = GPTQModel.load(model_dir, cfg, device="cpu", dtype=torch.float32)
    loaded = time.perf_counter()
    model.quantize(calib, batch_size=4)
    quantized = time.perf_counter()
    model.save(out_dir)
    saved = time.perf_counter()
    Path(result).write_text(json.dumps({
        "load_seconds": round(loaded - started, 1),
        "quantize_seconds": round(quantized - loaded, 1),
        "save_seconds": round(saved - quantized, 1),
        "config": {"bits": 4, "group_size": group, "sym": sym, "desc_act": desc_act,
                   "act_group_aware": False, "damp_percent": 0.01},
    }, indent=2))


def _load(checkpoint: str, loader: str, backend: str | None, dtype: Any = None) -> Any:
    import torch

    dtype = dtype or torch.float32
    if loader == "transformers":
        from transformers import AutoModelForCausalLM, GPTQConfig

        extra = {"quantization_config": GPTQConfig(bits=4, backend=backend)} if backend else {}
        return AutoModelForCausalLM.from_pretrained(checkpoint, device_map="cpu", dtype=dtype,
                                                    trust_remote_code=False, **extra)
    from gptqmodel import GPTQModel

    extra = {"backend": backend} if backend else {}
    return GPTQModel.load(checkpoint, device="cpu", dtype=dtype, **extra).model


def _score(net: Any, windows: Any) -> tuple[float, int]:
    import torch
    import torch.nn.functional as F

    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, windows.shape[0], 4):
            batch = windows[start:start + 4]
            logits = net(input_ids=batch).logits.float()
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                  batch[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            tokens += batch[:, 1:].numel()
    return total, tokens


def ppl(checkpoint: str, windows_path: str, result: str, loader: str = "gptqmodel") -> None:
    """Perplexity of a checkpoint as GPTQModel (or transformers + optimum) loads it.

    First with the loader's automatic kernel choice; if that kernel fails (GPTQModel's
    CPU int4 kernel needs in_features divisible by the group size, although its
    validation accepts 576 with group 128), again with GPTQModel's pure-torch kernel in
    bfloat16 (the only float dtypes it takes), and the first failure is reported too.
    """
    import torch
    from safetensors.torch import load_file

    windows = load_file(windows_path)["ids"]
    auto_error = None
    started = time.perf_counter()
    try:
        net = _load(checkpoint, loader, None).eval()
        total, tokens = _score(net, windows)
        backend = "auto"
    except RuntimeError as err:
        auto_error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
        print(f"automatic kernel failed ({auto_error}); retrying with gptq_torch", flush=True)
        started = time.perf_counter()
        net = _load(checkpoint, loader, "gptq_torch", torch.bfloat16).eval()
        total, tokens = _score(net, windows)
        backend = "gptq_torch"
    Path(result).write_text(json.dumps({
        "ppl": math.exp(total / tokens), "tokens": tokens, "windows": int(windows.shape[0]),
        "seconds": round(time.perf_counter() - started, 1), "backend": backend,
        "auto_error": auto_error,
        "kernels": sorted({type(m).__name__ for m in net.modules() if hasattr(m, "qweight")}),
        "dtype": str(next(net.parameters()).dtype),
    }, indent=2))


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "quantize":
        group = int(rest[rest.index("--group") + 1]) if "--group" in rest else 128
        quantize(*rest[:4], sym="--sym" in rest, desc_act="--desc-act" in rest, group=group)
    elif cmd == "ppl":
        ppl(*rest[:3])
    elif cmd == "hf-ppl":
        ppl(*rest[:3], loader="transformers")
    else:
        raise SystemExit(f"unknown command {cmd!r}; use quantize or ppl")
