"""`qcal calib diagnose` from options to report files (qcal.calib.diagnose does the work):
every input read and checked before the model loads or a file is written; STEM.json and
STEM.md at the end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from qcal.calib.diagnose import (
    decoded,
    evaluation_splits,
    leakage_report,
    model_report,
    text_report,
)
from qcal.errors import ConfigError
from qcal.results import markdown_table, provenance, provenance_markdown, write_results


def layer_indices(spec: str, depth: int) -> list[int]:
    """'0,mid,last' (or indices) as decoder-layer indices of a `depth`-layer model."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        value = {"mid": depth // 2, "last": depth - 1}.get(item)
        if value is None:
            if not item.isdigit() or int(item) >= depth:
                raise ConfigError(f"--layers {item!r} is not a layer of this {depth}-layer model; "
                                  f"use indices below {depth}, mid or last")
            value = int(item)
        out.append(value)
    return sorted(set(out))


def _target_windows(target: str, tokenizer: Any, n: int, seqlen: int, seed: int
                    ) -> dict[str, torch.Tensor]:
    """{target name: windows [<= n, seqlen]}: the packaged corpus's held-out chapters per
    language, or a saved set / source as --calib reads it."""
    from qcal.calib.build import resolve_calib
    from qcal.data.corpus import available_languages, eval_text

    langs = [x.strip() for x in target.split(",") if x.strip()]
    known = set(available_languages("debian-handbook"))
    if langs and all(lang in known for lang in langs):
        out = {}
        for lang in langs:
            ids = tokenizer(eval_text(lang), return_tensors="pt")["input_ids"][0]
            rows = min(n, ids.numel() // seqlen)
            if rows < 1:
                raise ConfigError(f"the held-out {lang} text has fewer than {seqlen} tokens")
            out[f"held-out {lang}"] = ids[: rows * seqlen].view(rows, seqlen)
        return out
    return {target: resolve_calib(target, tokenizer, n, seqlen, seed).input_ids}


def _output(args: argparse.Namespace, name: str) -> Path:
    from qcal.paths import results_dir

    stem = Path(args.output) if args.output else results_dir() / f"diagnose-{name}"
    for path in (stem.with_suffix(".json"), stem.with_suffix(".md")):
        if path.exists() and not args.overwrite and not _ours(path):
            raise ConfigError(f"{path} exists and is not a qcal diagnose report; move it away or "
                              "pass --overwrite")
    return stem


def _ours(path: Path) -> bool:
    if path.suffix == ".md":
        return path.read_text(errors="replace").startswith("# Calibration diagnosis")
    try:
        return json.loads(path.read_text()).get("kind") == "qcal-calib-diagnose"
    except (OSError, ValueError, AttributeError):
        return False


def diagnose_command(args: argparse.Namespace) -> int:
    from qcal.calib.build import resolve_calib
    from qcal.config import GPTQConfig, QuantScheme
    from qcal.devices import resolve_device
    from qcal.model.loading import load_model, load_tokenizer, resolve_model_dir

    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    tokenizer = load_tokenizer(model_dir, args.trust_remote_code)
    calib = resolve_calib(args.set, tokenizer, args.nsamples, args.seqlen, args.seed)
    name = Path(str(args.set)).name.replace(":", "-")
    stem = _output(args, name)
    cfg = GPTQConfig(QuantScheme(args.bits, args.group_size, allow_ragged=True))
    targets = {} if args.no_model else _target_windows(
        args.target, tokenizer, args.target_windows, calib.seqlen, args.seed)
    texts = decoded(calib, tokenizer)  # once, for the text and the leakage reports
    data: dict[str, Any] = {"kind": "qcal-calib-diagnose", "set": str(args.set),
                            "digest": calib.digest, "model": str(model_dir),
                            "text": text_report(calib, tokenizer, texts),
                            "leakage": leakage_report(calib, tokenizer, evaluation_splits(),
                                                      texts)}
    if targets:
        device = resolve_device(args.device)
        net, _, src = load_model(model_dir, trust_remote_code=args.trust_remote_code,
                                 stream=True, tokenizer=tokenizer)
        from qcal.model.arch import decoder_layers
        from qcal.model.resolve import arch_for

        layers = layer_indices(args.layers, len(decoder_layers(net, arch_for(net))))
        data["scheme"] = {"bits": args.bits, "group_size": args.group_size}
        data["targets"] = model_report(net, calib.input_ids, targets, layers, cfg,
                                       weights_dir=Path(src), device=device)
    data["provenance"] = provenance(command=getattr(args, "command_line", None))
    stem.parent.mkdir(parents=True, exist_ok=True)
    data["plots"] = plot_layers(data.get("targets", {}), stem)
    write_results(stem, data, render(data))
    print(f"wrote {stem}.json and {stem}.md")
    flagged = data["leakage"]["flagged"]
    if flagged:
        print(f"LEAKAGE: the set contains {len(flagged)} evaluation split(s): "
              f"{', '.join(flagged[:5])}")
    return 0


PLOTTED = {"predicted_damage": "predicted damage (1: as calibrating on the target)",
           "under_excited_top_channels": "target's top-1% channels the set under-excites",
           "eigenspace_overlap": "top-16 Hessian eigenspace overlap"}


def plot_layers(targets: dict[str, Any], stem: Path) -> list[str]:
    """One PNG per statistic: its mean over a layer's linears, by sampled layer, one line
    per target; returns the file names (beside STEM.md)."""
    if not targets:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for key, label in PLOTTED.items():
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for target, rep in targets.items():
            layers = sorted(rep["layers"], key=int)
            ax.plot([int(x) for x in layers],
                    [sum(v[key] for v in rep["layers"][x].values()) / len(rep["layers"][x])
                     for x in layers], marker="o", label=target)
        ax.set_xlabel("decoder layer")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}_{key}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        names.append(path.name)
    return names


def render(data: dict[str, Any]) -> str:
    text = data["text"]
    stats = text.get("statistics", {})
    lines = [f"# Calibration diagnosis: {data['set']}", "",
             f"Set digest `{data['digest']}`, model `{data['model']}`.", "",
             "## Text", "",
             markdown_table(["windows", "seqlen", "tokens", "documents", "max windows/doc",
                             "exact duplicates", "near-duplicate pairs", "type/token",
                             "Zipf exponent", "windows with chat markers"],
                            [[text["windows"], text["seqlen"], text["tokens"], text["documents"],
                              text["max_windows_per_document"], text["exact_duplicate_windows"],
                              len(text["near_duplicate_pairs"]), stats.get("type_token_ratio"),
                              (stats.get("zipf") or {}).get("exponent"),
                              text["windows_with_chat_markers"]]]),
             "", "Language share: " + ", ".join(f"{k} {v:.0%}"
                                                 for k, v in text["language_share"].items()), "",
             "## Leakage into evaluation data (word 13-grams)", ""]
    leak = data["leakage"]
    if leak["flagged"]:
        lines += [f"**The set contains evaluation data**: {', '.join(leak['flagged'])}. A "
                  "quantized model calibrated on it will look better on those splits than it "
                  "is; `qcal compare` refuses such cells.", ""]
    rows = sorted(leak["splits"].items(), key=lambda kv: -kv[1]["set_share"])[:10]
    lines += ["The splits sharing most with the set: of each split's 13-grams, the share the "
              "set holds, and of the set's, the share the split holds (flagged at 1% either "
              "way).", "",
              markdown_table(["split", "13-grams", "in the set", "share of the split",
                              "share of the set"],
                             [[k, v["ngrams"], v["shared"], v["share"], v["set_share"]]
                              for k, v in rows], ".4f"), ""]
    for target, rep in data.get("targets", {}).items():
        lines += [f"## The model's view against {target}", "",
                  f"Predicted damage (GPTQ w{data['scheme']['bits']} g"
                  f"{data['scheme']['group_size']} with this set's Hessians, error on the "
                  f"target's, relative to calibrating on the target; 1 is ideal): "
                  f"**{rep['predicted_damage']:.3f}**", "",
                  markdown_table(["layer", "linear", "damage", "under-excited top channels",
                                  "top-16 eigenspace overlap"],
                                 [[layer, name, v["predicted_damage"],
                                   v["under_excited_top_channels"], v["eigenspace_overlap"]]
                                  for layer, per in rep["layers"].items()
                                  for name, v in per.items()]), ""]
    lines += [f"![{name}]({name})" for name in data.get("plots", [])]
    lines += ["", provenance_markdown(data["provenance"])]
    return "\n".join(lines)
