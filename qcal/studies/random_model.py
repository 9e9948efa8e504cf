"""Write a random Llama-shaped bf16 model as sharded safetensors, one tensor at a time.

For memory and speed benchmarks of models bigger than RAM (results/big_model.md):
random weights measure memory and time only, never quality. The model is never built:
every shard's header is computed from the shapes first, then each tensor is drawn,
cast and appended to its file, so the peak memory is the largest single tensor (the
embedding). The tokenizer is copied from a real model directory (default: the
provisioned default model), so the vocabulary matches `vocab_size`.

    python -m qcal.studies.random_model --shape 1b -o runs/random-1b
    python -m qcal.studies.random_model --shape 8b -o runs/random-8b --shard-size 2GB
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import sys
from pathlib import Path

import torch

from qcal.model.shards import plan_shards
from qcal.model.stream import parse_bytes

SHAPES = {
    # layers, hidden, intermediate, heads, kv heads, vocab, tied embeddings
    "tiny": (4, 256, 512, 4, 2, 49152, True),
    "1b": (16, 2048, 8192, 32, 8, 49152, True),
    "8b": (32, 4096, 14336, 32, 8, 49152, False),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")
WEIGHT_STD = 0.02


def tensor_shapes(shape: str) -> dict[str, tuple[int, ...]]:
    layers, hidden, inter, heads, kv_heads, vocab, tied = SHAPES[shape]
    head_dim = hidden // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
    shapes["model.norm.weight"] = (hidden,)
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def model_config(shape: str, tokenizer_dir: Path) -> dict:
    layers, hidden, inter, heads, kv_heads, vocab, tied = SHAPES[shape]
    base = json.loads((tokenizer_dir / "config.json").read_text())
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads, "vocab_size": vocab, "tie_word_embeddings": tied,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": base.get("bos_token_id"), "eos_token_id": base.get("eos_token_id"),
        "torch_dtype": "bfloat16", "initializer_range": WEIGHT_STD,
    }


def draw(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    out = torch.empty(shape, dtype=torch.bfloat16)
    rows_per_chunk = max(1, (1 << 24) // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], rows_per_chunk):  # float32 draws in 64 MiB pieces
        piece = torch.randn((min(rows_per_chunk, shape[0] - start), *shape[1:]), generator=gen)
        out[start:start + piece.shape[0]] = piece.mul_(WEIGHT_STD)
    return out


def write_shard(path: Path, names: list[str], shapes: dict[str, tuple[int, ...]],
                gen: torch.Generator) -> int:
    """One safetensors file, header first (offsets from the shapes), then tensor by tensor."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        nbytes = 2 * math.prod(shapes[name])
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in names:
            f.write(draw(name, shapes[name], gen).view(torch.uint8).numpy().tobytes())
    return offset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--shard-size", default="1GB", help="bytes per shard (e.g. 500MB, 2GB)")
    ap.add_argument("--tokenizer", type=Path, default=Path("models/smollm2-135m-instruct"),
                    help="model directory whose tokenizer (vocabulary 49152) is copied")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out: Path = args.output
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists and is not empty; choose another -o or remove it", file=sys.stderr)
        return 2
    if not (args.tokenizer / "tokenizer.json").is_file():
        print(f"{args.tokenizer} has no tokenizer.json; pass --tokenizer DIR", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    shapes = tensor_shapes(args.shape)
    entries = [(name, torch.bfloat16, shape) for name, shape in shapes.items()]
    shards = [[name for name, _, _ in shard]
              for shard in plan_shards([entries], parse_bytes(args.shard_size, "--shard-size"))]
    gen = torch.Generator().manual_seed(args.seed)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards):
        fname = (f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
                 else "model.safetensors")
        total += write_shard(out / fname, names, shapes, gen)
        weight_map.update({n: fname for n in names})
        print(f"wrote {fname} ({len(names)} tensors)", flush=True)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(model_config(args.shape, args.tokenizer), indent=2))
    for name in TOKENIZER_FILES:
        if (args.tokenizer / name).is_file():
            shutil.copy(args.tokenizer / name, out / name)
    params = sum(math.prod(s) for s in shapes.values())
    print(f"{out}: {params / 1e9:.2f}B parameters, {total / 1e9:.2f} GB in {len(shards)} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
