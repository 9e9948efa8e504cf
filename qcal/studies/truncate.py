"""A copy of a real model that keeps only its first N decoder layers (real weights, its own
embeddings, final norm and head), for timing quantizers per layer when a whole run of a big
model does not fit a session. Written shard by shard from the safetensors files (the kept
tensors of one shard in memory at a time); the copy says in config.json and TRUNCATED.json what it is.
Its perplexity means nothing; its per-layer times and memory are the real model's.

    python -m qcal.studies.truncate MODEL_DIR N OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from qcal.fsio import check_output, write_dir_atomically

# Decoder-layer tensors as transformers names them in every family qcal streams.
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def kept(name: str, n_layers: int) -> bool:
    """Whether tensor `name` belongs to the first `n_layers` layers or to no layer at all."""
    match = _LAYER.search(name)
    return match is None or int(match.group(1)) < n_layers


def truncate_model(model_dir: Path, n_layers: int, out: Path) -> Path:
    """Write the first `n_layers` layers of `model_dir` to `out` (refused if it has fewer)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    total = config["num_hidden_layers"]
    if not 0 < n_layers <= total:
        raise SystemExit(f"{model_dir} has {total} layers; ask for 1..{total}, not {n_layers}")
    check_output(out, "truncated model")

    def fill(tmp: Path) -> None:
        index: dict[str, str] = {}
        for shard in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(shard), "pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys() if kept(k, n_layers)}  # noqa: SIM118
            if tensors:
                save_file(tensors, str(tmp / shard.name), metadata={"format": "pt"})
                index.update(dict.fromkeys(tensors, shard.name))
                del tensors
        if len(set(index.values())) > 1 or (model_dir / "model.safetensors.index.json").exists():
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {}, "weight_map": dict(sorted(index.items()))}, indent=2))
        for key in ("layer_types",):  # per-layer lists follow the layer count
            if isinstance(config.get(key), list):
                config[key] = config[key][:n_layers]
        config["num_hidden_layers"] = n_layers
        if "max_window_layers" in config:
            config["max_window_layers"] = min(config["max_window_layers"], n_layers)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for extra in model_dir.iterdir():
            if extra.is_file() and (extra.name.startswith(("tokenizer", "generation_config",
                                                           "special_tokens", "chat_template"))
                                    or extra.name in ("vocab.json", "merges.txt")):
                shutil.copy2(extra, tmp / extra.name)
        (tmp / "TRUNCATED.json").write_text(json.dumps(
            {"from": str(model_dir), "layers_kept": n_layers, "layers_in_model": total,
             "note": "the first layers of a real model, for per-layer timing only; its "
                     "outputs and perplexity are not the model's"}, indent=2))

    return write_dir_atomically(out, fill, "truncated model")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("layers", type=int)
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    truncate_model(args.model, args.layers, args.out)
    print(f"wrote the first {args.layers} layers of {args.model} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
