"""The model card (`README.md`) written into every checkpoint.

Hugging Face's convention: YAML front matter (base_model, license, library_name, tags,
model-index) then prose. It says what the checkpoint is: the base model as a Hub id where
one is known (from the model folder's PROVENANCE.json, its own card, or the Hub cache
path it was read from), the base model's licence, method and scheme, the calibration
set's manifest, the format with a loading recipe that the test suite runs, the qcal
version and the command that made this very folder, and the evaluation when one ran.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

QCAL_VERSION = "0.1.0"
HUB_ID = re.compile(r"\b([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)")
# Licence names as PROVENANCE.json or a card spells them -> the Hub's licence identifiers.
LICENCES = {"apache-2.0": "apache-2.0", "apache 2.0": "apache-2.0", "mit": "mit",
            "gemma": "gemma", "llama3": "llama3", "cc-by-4.0": "cc-by-4.0"}

# How to load each format; every recipe is exercised by tests/integration/test_interop.py
# and test_card.py. {path} is the checkpoint folder.
LOADING = {
    "compressed-tensors": (
        "compressed-tensors `pack-quantized` (qcal's default). Loads with nothing but "
        "`transformers` and `compressed-tensors`, symmetric or asymmetric, with or without "
        "act-order, and is served natively by vLLM:\n\n"
        "```python\nfrom transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(\"{path}\")\n```\n\n"
        "```bash\nlm_eval --model hf --model_args pretrained={path} --tasks <tasks>\n"
        "vllm serve {path}\n```"),
    "gptq": (
        "GPTQ layout (`quant_method: gptq`, zero points stored minus one). transformers reads "
        "it only with GPTQModel/optimum installed; GPTQModel and vLLM read it directly. "
        "With qcal alone, load it or convert it to the default format:\n\n"
        "```python\nimport qcal\nmodel = qcal.load(\"{path}\")\n```\n\n"
        "```bash\nqcal export --model {path} --format compressed-tensors -o <new dir>\n```\n\n"
        "(An act-order checkpoint whose groups follow g_idx has no compressed-tensors form: "
        "qcal refuses that export in one line; use qcal.load, GPTQModel or vLLM.)"),
    "gptq_v2": (
        "GPTQ layout with true zero points (`checkpoint_format: gptq_v2`), the form GPTQModel "
        "needs for asymmetric schemes. With qcal alone, load it or convert it to the default "
        "format:\n\n"
        "```python\nimport qcal\nmodel = qcal.load(\"{path}\")\n```\n\n"
        "```bash\nqcal export --model {path} --format compressed-tensors -o <new dir>\n```\n\n"
        "(An act-order checkpoint whose groups follow g_idx has no compressed-tensors form: "
        "qcal refuses that export in one line; use qcal.load or GPTQModel.)"),
    "awq": (
        "AWQ GEMM layout (`quant_method: awq`, `version: gemm`): vLLM reads it; transformers "
        "only with GPTQModel installed. With qcal alone, load it or convert it to the default "
        "format:\n\n"
        "```python\nimport qcal\nmodel = qcal.load(\"{path}\")\n```\n\n"
        "```bash\nqcal export --model {path} --format compressed-tensors -o <new dir>\n```"),
}


def _front_matter_field(card: str, key: str) -> str | None:
    head = card.split("---")[1] if card.startswith("---") and card.count("---") >= 2 else ""
    match = re.search(rf"^{key}:\s*\"?([^\"\n]+)\"?\s*$", head, re.MULTILINE)
    return match.group(1).strip() if match else None


def _hub_cache_id(path: Path) -> str | None:
    """org/name of a folder inside the Hub cache (models--org--name/snapshots/<sha>)."""
    for part in path.parts:
        if part.startswith("models--"):
            return "/".join(part.removeprefix("models--").split("--", 1))
    return None


def base_model_info(source: str | Path) -> dict[str, str | None]:
    """The Hub id and the licence of the float model qcal quantized, where knowable."""
    path = Path(str(source))
    hub_id, licence = _hub_cache_id(path), None
    try:
        prov = json.loads((path / "PROVENANCE.json").read_text())
    except (OSError, ValueError):
        prov = {}
    if not hub_id and isinstance(prov.get("original"), str):
        match = HUB_ID.search(prov["original"])
        hub_id = match.group(1) if match else None
    try:
        card = (path / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        card = ""
    licence = _front_matter_field(card, "license")
    if licence is None:
        text = " ".join(str(prov.get(k, "")) for k in ("licence", "license", "original")).lower()
        licence = next((hub for name, hub in LICENCES.items() if name in text), None)
    if hub_id is None and not path.is_absolute() and HUB_ID.fullmatch(str(source).split("@")[0]):
        hub_id = str(source).split("@")[0]  # given as a Hub id (`--model org/name[@rev]`)
    return {"hub_id": hub_id, "license": licence}


def model_index(name: str, evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    """The Hub's `model-index` entry for qcal's evaluation results."""
    results = []
    for lang, row in (evaluation.get("perplexity") or {}).items():
        results.append({
            "task": {"type": "text-generation", "name": "Language modelling"},
            "dataset": {"name": f"qcal held-out text ({lang})", "type": f"qcal-heldout-{lang}"},
            "metrics": [{"type": "perplexity", "value": row.get("quantized"),
                         "name": f"Perplexity ({lang}, {row.get('windows')} windows)"}],
        })
    for task, row in (evaluation.get("tasks") or {}).items():
        results.append({"task": {"type": "text-generation"},
                        "dataset": {"name": task, "type": task},
                        "metrics": [{"type": k, "value": v} for k, v in row.items()]})
    return [{"name": name, "results": results}] if results else []


def _calibration_lines(manifest: dict[str, Any] | None) -> list[str]:
    if not manifest:
        return ["- Calibration: none (the method uses no calibration data)"]
    stats = manifest.get("statistics") or {}
    langs = stats.get("per_language_tokens") or {}
    return [
        f"- Calibration selector: `{manifest.get('selector')}` {json.dumps(manifest.get('params') or {})}",
        f"- Calibration source: {manifest.get('source')}; languages: "
        + (", ".join(f"{k} ({v} tokens)" for k, v in langs.items()) or "-"),
        f"- Calibration size: {manifest.get('nsamples')} x {manifest.get('seqlen')} tokens, seed "
        f"{manifest.get('seed')}, digest `{str(manifest.get('digest', ''))[:16]}`",
    ]


def _arch_lines(arch: dict[str, Any] | None) -> list[str]:
    """What qcal resolved of the architecture (the full spec is in quant_log.json)."""
    if not arch:
        return []
    linears = sum(len(step) for step in arch.get("sequential") or ())
    groups = ", ".join(f"{g['prev_op']} -> {len(g['linears'])}" for g in arch.get("scale_groups") or ())
    return [f"- Architecture (resolved by qcal): model type `{arch.get('model_type')}`, "
            f"{linears} linears per decoder layer in {len(arch.get('sequential') or ())} "
            f"true-sequential steps; re-expressed as linears: {', '.join(arch.get('adapted') or ()) or '-'}; "
            f"kept float: {', '.join(arch.get('float_linears') or ()) or '-'}; AWQ scale groups: "
            f"{groups or '-'}"]


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block YAML of plain data (JSON scalars are valid YAML scalars)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines += [f"{pad}{k}:", *_yaml(v, indent + 2)]
            else:
                lines.append(f"{pad}{k}: {json.dumps(v)}")
    else:
        for item in value:
            sub = _yaml(item, indent + 2) if isinstance(item, (dict, list)) else [
                f"{pad}  {json.dumps(item)}"]
            lines.append(f"{pad}- {sub[0].strip()}")
            lines += sub[1:]
    return lines


def _rotation_lines(rotation: dict[str, Any] | None) -> list[str]:
    if not rotation:
        return []
    return [f"- Rotated before quantizing (`--rotate {rotation['kind']}:{rotation['seed']}`): a "
            f"randomized Hadamard rotation of the {rotation['hidden']}-wide residual stream "
            "folded into the weights (norm weights folded into the linears they feed); no "
            "rotation runs at inference"
            + ("; the head is untied from the embedding (the final norm's fold needs it)"
               if rotation.get("untied_head") else "")]


def model_card(meta: dict[str, Any], fmt: str, base_model: str, command: str | None = None,
               evaluation: dict[str, Any] | None = None) -> str:
    """README.md text for a checkpoint described by its quant_log `meta`."""
    config = meta.get("config") or {}
    scheme = config.get("scheme") or {}
    method = meta.get("method", "?")
    bits, group, sym = scheme.get("bits"), scheme.get("group_size"), scheme.get("sym")
    extras = {k: v for k, v in config.items() if k != "scheme"}
    info = base_model_info(base_model)
    base = info["hub_id"] or base_model
    title = f"{str(base).rstrip('/').split('/')[-1]}: {str(method).upper()} w{bits} g{group}"
    front: dict[str, Any] = {"base_model": base, "base_model_relation": "quantized"}
    if info["license"]:
        front["license"] = info["license"]
    front |= {"library_name": "transformers", "pipeline_tag": "text-generation",
              "tags": ["qcal", str(method), f"{bits}-bit", fmt, "quantized"]}
    index = model_index(title, evaluation or {})
    if index:
        front["model-index"] = index
    lines = [
        f"# {title}",
        "",
        f"Quantized with qcal {QCAL_VERSION} after training, from `{base}`"
        + (f" (read from `{base_model}`)." if str(base) != str(base_model) else "."),
        "",
        f"- Method: {method}; scheme: {bits}-bit, group size {group}, "
        f"{'symmetric' if sym else 'asymmetric'}",
        f"- Method settings: `{json.dumps(extras, sort_keys=True)}`",
        *(["- Per-module schemes (`--scheme-override`, first match wins): "
           + ", ".join(f"`{o}`" for o in meta["scheme_overrides"])]
          if meta.get("scheme_overrides") else []),
        *_rotation_lines(meta.get("rotation")),
        *_calibration_lines(meta.get("calibration")),
        *_arch_lines(meta.get("arch")),
        f"- Base model licence: {info['license'] or 'see the base model'}",
        f"- Quantization time: {meta.get('quantize_seconds')} s",
        *[f"- Note: {note}" for note in meta.get("notes") or ()],
    ]
    if meta.get("exported_from"):
        lines.append(f"- Exported to {fmt} from `{meta['exported_from']}`")
    if command:
        lines.append(f"- Command: `{command}`")
    lines += ["", "## Loading", "", LOADING.get(fmt, fmt).replace("{path}", "<this folder>")]
    if evaluation:
        lines += ["", "## Evaluation", ""]
        for lang, row in (evaluation.get("perplexity") or {}).items():
            lines.append(f"- Perplexity [{lang}]: {row.get('quantized')} (float {row.get('float')}, "
                         f"{row.get('tokens')} tokens in {row.get('windows')} windows)")
    lines += ["", "Files: `quant_log.json` holds the full recipe, calibration manifest and "
              "per-linear losses; `.qcal-output.json` marks the folder as qcal's output."]
    return "\n".join(["---", *_yaml(front), "---", *lines]) + "\n"
