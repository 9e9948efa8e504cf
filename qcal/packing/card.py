"""The model card (`README.md`) written into every checkpoint.

Hugging Face's convention: YAML front matter (base_model, library_name, tags) then prose.
It says what the checkpoint is: base model, method and scheme, the calibration set's
manifest (sources, languages, selector, seed, digest), the format and how to load it,
the qcal version and command, and the evaluation summary when one was run.
"""

from __future__ import annotations

import json
from typing import Any

QCAL_VERSION = "0.1.0"

LOADING = {
    "gptq": "GPTQ layout (`quant_method: gptq`): qcal, GPTQModel, transformers + GPTQModel/optimum, "
            "vLLM (Marlin needs in_features divisible by the group size).",
    "gptq_v2": "GPTQ layout with true zero points (`checkpoint_format: gptq_v2`): qcal, "
               "GPTQModel (which loads asymmetric GPTQ checkpoints only in this form).",
    "compressed-tensors": "compressed-tensors `pack-quantized`: vLLM natively; transformers with the "
                          "`compressed-tensors` package (asymmetric exports: pass "
                          "`quantization_config=CompressedTensorsConfig(dequantize=True)`); qcal.",
    "awq": "AWQ GEMM layout (`quant_method: awq`, `version: gemm`): AutoAWQ-format loaders "
           "(vLLM, transformers' AWQ integration on GPU) and qcal.",
}


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


def model_card(meta: dict[str, Any], fmt: str, base_model: str, command: str | None = None,
               evaluation: dict[str, Any] | None = None) -> str:
    """README.md text for a checkpoint described by its quant_log `meta`."""
    config = meta.get("config") or {}
    scheme = config.get("scheme") or {}
    method = meta.get("method", "?")
    bits, group, sym = scheme.get("bits"), scheme.get("group_size"), scheme.get("sym")
    extras = {k: v for k, v in config.items() if k != "scheme"}
    front = ["---", f"base_model: {json.dumps(base_model)}", "library_name: transformers",
             "tags:", "  - qcal", f"  - {method}", f"  - {bits}-bit", "  - quantized", "---"]
    lines = [
        f"# {base_model.rstrip('/').split('/')[-1]}: {method.upper()} w{bits} g{group}",
        "",
        f"Quantized with qcal {QCAL_VERSION} after training, from `{base_model}`.",
        "",
        f"- Method: {method}; scheme: {bits}-bit, group size {group}, "
        f"{'symmetric' if sym else 'asymmetric'}",
        f"- Method settings: `{json.dumps(extras, sort_keys=True)}`",
        *_calibration_lines(meta.get("calibration")),
        f"- Format: {LOADING.get(fmt, fmt)}",
        *_arch_lines(meta.get("arch")),
        f"- Quantization time: {meta.get('quantize_seconds')} s",
        *[f"- Note: {note}" for note in meta.get("notes") or ()],
    ]
    if command:
        lines.append(f"- Command: `{command}`")
    if evaluation:
        lines += ["", "## Evaluation", ""]
        for lang, row in (evaluation.get("perplexity") or {}).items():
            lines.append(f"- Perplexity [{lang}]: {row.get('quantized')} (float {row.get('float')}, "
                         f"{row.get('tokens')} tokens in {row.get('windows')} windows)")
    lines += ["", "Files: `quant_log.json` holds the full recipe, calibration manifest and "
              "per-linear losses; `.qcal-output.json` marks the folder as qcal's output."]
    return "\n".join(front + lines) + "\n"
