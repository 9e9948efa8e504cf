"""Runs inside AutoAWQ's own virtualenv (no qcal import): AWQ-quantize the model on given ids.

Called by scripts/bench_peers.py; every input comes from files it wrote, every output goes
to a JSON file it reads. Per-layer times are taken at the start of each decoder layer's
search (AutoAWQ's `_get_input_feat` runs first for every layer); with --max-layers N the
run stops after N layers and reports only those times (no checkpoint).

    python peer_autoawq_worker.py MODEL_DIR CALIB.safetensors OUT_DIR RESULT.json \
        --group 64 [--max-layers N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


class _Enough(Exception):
    """Raised at the start of layer N+1 when only N layers were asked for."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("calib")
    p.add_argument("out_dir")
    p.add_argument("result")
    p.add_argument("--group", type=int, default=64)
    p.add_argument("--max-layers", type=int, default=0)
    args = p.parse_args()

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


if __name__ == "__main__":
    main()
