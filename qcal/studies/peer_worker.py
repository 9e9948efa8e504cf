"""Runs inside a peer's own virtualenv (no qcal import): quantize with GPTQModel or AutoAWQ,
or score a checkpoint as GPTQModel or transformers (+ optimum) loads it. Run by
qcal.studies.peers (its benchmarks); every input comes from files they wrote (token ids as safetensors,
never pickle), every output goes to a JSON file it reads.

    python peer_worker.py gptqmodel MODEL_DIR CALIB.safetensors OUT_DIR RESULT.json \
        [--sym] [--desc-act] [--group G] [--dtype float32|bfloat16] [--max-layers N]
    python peer_worker.py autoawq MODEL_DIR CALIB.safetensors OUT_DIR RESULT.json \
        --group 64 [--max-layers N]
    python peer_worker.py ppl|hf-ppl CHECKPOINT_DIR WINDOWS.safetensors RESULT.json
    python peer_worker.py hf-generate CHECKPOINT_DIR PROMPT.txt RESULT.json
    python peer_worker.py llmcompressor MODEL_DIR CALIB.safetensors OUT_DIR RESULT.json \
        [--desc-act] [--group G]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any


def gptqmodel(model_dir: str, calib_path: str, out_dir: str, result: str, sym: bool,
              desc_act: bool = False, group: int = 128, dtype: str = "float32",
              max_layers: int = 0, method: str = "gptq") -> None:
    """GPTQ (or, with method "awq", AWQ in its GEMM format) with GPTQModel. The result JSON
    is rewritten after every decoder layer (a run stopped from outside still says how far it
    got); with `max_layers` N it stops after N layers (GPTQModel's layer callback) and saves
    nothing."""
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.looper.module_looper import StopMainLoop
    from safetensors.torch import load_file

    ids = load_file(calib_path)["ids"]
    calib = [{"input_ids": row.tolist(), "attention_mask": [1] * row.numel()} for row in ids]
    # Matched to qcal's settings: plain GPTQ (act-order only when asked), no group-aware
    # reordering (a GPTQModel extension qcal does not have).
    if method == "awq":  # its own AWQ defaults: zero point, GEMM layout
        settings: dict[str, Any] = {"bits": 4, "group_size": group, "method": "awq",
                                    "format": "gemm"}
    else:
        settings = {"bits": 4, "group_size": group, "sym": sym, "desc_act": desc_act,
                    "act_group_aware": False, "damp_percent": 0.01}
    cfg = QuantizeConfig(**settings)
    info: dict[str, Any] = {"config": {**settings, "dtype": dtype},
                            "finished": False, "layer_seconds": []}
    started = time.perf_counter()

    def write() -> None:
        Path(result).write_text(json.dumps(info, indent=2))

    # qcal computes in float32; GPTQModel's CPU default is bfloat16 (its stored dtype).
    model = GPTQModel.load(model_dir, cfg, device="cpu", dtype=getattr(torch, dtype))
    loaded = time.perf_counter()
    info["load_seconds"] = round(loaded - started, 1)
    stamps = [loaded]
    write()

    def layer_done(layer_idx: int, submodule_finalized: bool) -> Any:
        if not submodule_finalized:
            return None
        stamps.append(time.perf_counter())
        if not (max_layers and len(info["layer_seconds"]) >= max_layers):
            info["layer_seconds"].append(round(stamps[-1] - stamps[-2], 2))
            write()
        # GPTQModel ends its loop quietly on this answer (quantize() returns normally).
        return StopMainLoop if max_layers and len(info["layer_seconds"]) >= max_layers else None

    model.layer_callback = layer_done
    # AWQ's automatic kernel choice wants CUDA ("AWQ: CUDA is not available"); its portable
    # torch kernel runs on the CPU.
    model.quantize(calib, batch_size=4, **({"backend": "awq_torch"} if method == "awq" else {}))
    info["finished"] = not (max_layers and len(info["layer_seconds"]) >= max_layers)
    quantized = time.perf_counter()
    info["quantize_seconds"] = round(quantized - loaded, 1)
    if info["finished"]:
        model.save(out_dir)
        info["save_seconds"] = round(time.perf_counter() - quantized, 1)
    write()


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



class _Enough(Exception):
    """Raised at the start of layer N+1 when only N layers were asked for."""


def autoawq(args: argparse.Namespace) -> None:
    """AWQ-quantize with AutoAWQ; per-layer times are taken at the start of each decoder
    layer's search (AutoAWQ's `_get_input_feat` runs first for every layer); with
    --max-layers N the run stops after N layers and reports only those (no checkpoint)."""
    import torch
    from awq import AutoAWQForCausalLM
    from awq.quantize.quantizer import AwqQuantizer
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast

    ids = load_file(args.calib)["ids"]
    stamps: list[float] = []
    original = AwqQuantizer._get_input_feat

    def timed_input_feat(self, layer, named_linears):  # type: ignore[no-untyped-def]
        stamps.append(time.perf_counter())
        if args.max_layers and len(stamps) > args.max_layers:
            raise _Enough
        return original(self, layer, named_linears)

    AwqQuantizer._get_input_feat = timed_input_feat
    started = time.perf_counter()
    # float32 like qcal; AutoAWQ's default on CPU would be float16.
    model = AutoAWQForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32,
                                               device_map="cpu")
    # The tokenizer_config.json written by transformers 5 names a class 4.51 does not have;
    # the windows are token ids already, so the fast tokenizer from tokenizer.json suffices.
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(args.model_dir) / "tokenizer.json"))
    loaded = time.perf_counter()
    # Matched to qcal's AWQ defaults: w4, zero point (asymmetric), 20 ratios, no duo scaling,
    # clip search on; the same windows (lists of token ids are used as they are).
    config = {"zero_point": True, "q_group_size": args.group, "w_bit": 4, "version": "GEMM"}
    finished = True
    try:
        model.quantize(tokenizer, quant_config=config, calib_data=[row.tolist() for row in ids],
                       max_calib_samples=ids.shape[0], max_calib_seq_len=ids.shape[1],
                       duo_scaling=False)
    except _Enough:
        finished = False
    ended = time.perf_counter()
    stamps.append(ended)
    if finished:
        model.save_quantized(args.out_dir)
    layer_seconds = [round(b - a, 2) for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    if not finished:
        layer_seconds = layer_seconds[:args.max_layers]
    Path(args.result).write_text(json.dumps({
        "finished": finished,
        "load_seconds": round(loaded - started, 1),
        "quantize_seconds": round(ended - loaded, 1) if finished else None,
        "layer_seconds": layer_seconds,
        "config": {**config, "duo_scaling": False, "dtype": "float32"},
    }, indent=2))


def hf_generate(checkpoint: str, prompt_path: str, result: str, new_tokens: int = 96) -> None:
    """Greedy answer to a chat prompt from the checkpoint as bare transformers loads it
    (`from_pretrained(path)`, no extra argument; its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(checkpoint)
    net = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    loaded = time.perf_counter()
    messages = [{"role": "user", "content": Path(prompt_path).read_text().strip()}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with torch.no_grad():
        out = net.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    Path(result).write_text(json.dumps({
        "prompt": messages[0]["content"],
        "answer": tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True),
        "new_tokens": int(out.shape[1] - ids.shape[1]),
        "load_seconds": round(loaded - started, 1),
        "generate_seconds": round(time.perf_counter() - loaded, 1),
        "classes": sorted({type(m).__name__ for m in net.modules()
                           if "Linear" in type(m).__name__}),
    }, indent=2))

def llmcompressor_gptq(model_dir: str, calib_path: str, out_dir: str, result: str,
                       desc_act: bool, group: int) -> None:
    """GPTQ with llm-compressor's GPTQModifier (oneshot): w4 symmetric, damp 0.01, groups of
    `group`, act-order when asked ("weight": its only act-order left in 0.14, groups fixed
    before the reordering, as qcal's --static-groups); float32 like qcal."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ids = load_file(calib_path)["ids"]
    data = Dataset.from_dict({"input_ids": ids.tolist(),
                              "attention_mask": torch.ones_like(ids).tolist()})
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = time.perf_counter()
    scheme = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                 "strategy": "group", "group_size": group,
                                                 "actorder": "weight" if desc_act else None}}
    recipe = GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"],
                          dampening_frac=0.01)
    oneshot(model=model, dataset=data, recipe=recipe, max_seq_length=int(ids.shape[1]),
            num_calibration_samples=int(ids.shape[0]))
    quantized = time.perf_counter()
    model.save_pretrained(out_dir, save_compressed=True)
    Path(result).write_text(json.dumps({
        "finished": True, "load_seconds": round(loaded - started, 1),
        "quantize_seconds": round(quantized - loaded, 1),
        "save_seconds": round(time.perf_counter() - quantized, 1),
        "config": {"weights": scheme["weights"], "dampening_frac": 0.01, "dtype": "float32"},
    }, indent=2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=("gptqmodel", "autoawq", "ppl", "hf-ppl", "hf-generate",
                                       "llmcompressor"))
    p.add_argument("paths", nargs="+")
    p.add_argument("--group", type=int, default=None)
    p.add_argument("--sym", action="store_true")
    p.add_argument("--desc-act", action="store_true")
    p.add_argument("--max-layers", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--method", choices=("gptq", "awq"), default="gptq")
    args = p.parse_args()
    if args.command == "gptqmodel":
        gptqmodel(*args.paths[:4], sym=args.sym, desc_act=args.desc_act, group=args.group or 128,
                  dtype=args.dtype, max_layers=args.max_layers, method=args.method)
    elif args.command == "autoawq":
        args.model_dir, args.calib, args.out_dir, args.result = args.paths[:4]
        args.group = args.group or 64
        autoawq(args)
    elif args.command == "llmcompressor":
        llmcompressor_gptq(*args.paths[:4], desc_act=args.desc_act, group=args.group or 128)
    elif args.command == "hf-generate":
        hf_generate(*args.paths[:3])
    else:
        ppl(*args.paths[:3], loader="transformers" if args.command == "hf-ppl" else "gptqmodel")


if __name__ == "__main__":
    main()
