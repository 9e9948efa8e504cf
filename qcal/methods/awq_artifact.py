"""AWQ's search artifact and per-layer resume entries: safetensors tensors + JSON metadata.

An entry holds one layer's folded scales (with the ratio and losses that chose them)
and clip thresholds; the artifact holds every layer's entry plus the config, so
`apply_awq_artifact` can replay the search on a float model. No pickle anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors

from qcal.errors import CheckpointError
from qcal.fsio import atomic_write_bytes

ARTIFACT_FORMAT = "qcal-awq-search"
ARTIFACT_VERSION = 1
ARTIFACT_NAME = "awq_search.safetensors"
ARTIFACT_META_KEY = "qcal_awq"


def entry_path(work_dir: Path, index: int) -> Path:
    return work_dir / f"awq_layer_{index:04d}.safetensors"


def _flatten(entry: Mapping[str, Any], prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """An entry's tensors go to `tensors` under `prefix`; the rest is returned as JSON data."""
    scales = []
    for k, g in enumerate(entry["scales"]):
        tensors[f"{prefix}scales.{k}"] = g["scale"].detach().float().contiguous().cpu()
        scales.append({key: g[key] for key in ("prev_op", "linears", "ratio", "loss", "rtn_loss")})
    for name, clip in entry["clips"].items():
        tensors[f"{prefix}clips.{name}"] = clip.detach().contiguous().cpu()
    return {"scales": scales, "clips": sorted(entry["clips"])}


def _unflatten(data: Mapping[str, Any], prefix: str, tensors: Mapping[str, torch.Tensor]
               ) -> dict[str, Any]:
    scales = [{**g, "linears": list(g["linears"]), "scale": tensors[f"{prefix}scales.{k}"]}
              for k, g in enumerate(data["scales"])]
    return {"scales": scales, "clips": {n: tensors[f"{prefix}clips.{n}"] for n in data["clips"]}}


def artifact_bytes(artifact: Mapping[str, Any]) -> bytes:
    """The artifact as safetensors bytes: tensors plus JSON metadata (no pickle)."""
    tensors: dict[str, torch.Tensor] = {}
    head = {k: v for k, v in artifact.items() if k != "layers"}
    head["layers"] = [_flatten(e, f"layers.{i}.", tensors) for i, e in enumerate(artifact["layers"])]
    return save_safetensors(tensors, metadata={ARTIFACT_META_KEY: json.dumps(head)})


def write_entry(entry: Mapping[str, Any], path: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    data = _flatten(entry, "", tensors)
    atomic_write_bytes(path, save_safetensors(tensors, metadata={ARTIFACT_META_KEY: json.dumps(data)}))


def _read(path: Path, what: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if not path.is_file():
        raise CheckpointError(f"{what} {path} does not exist; run `qcal quantize --method awq`")
    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        return json.loads(meta[ARTIFACT_META_KEY]), tensors
    except (OSError, SafetensorError, ValueError, KeyError) as err:
        raise CheckpointError(f"{path} is not a readable qcal {what} ({str(err).splitlines()[0]}); "
                              "re-run the AWQ search") from None


def read_entry(path: Path) -> dict[str, Any]:
    data, tensors = _read(path, "AWQ resume state file")
    try:
        return _unflatten(data, "", tensors)
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"AWQ resume state file {path} is incomplete ({err}); start over "
                              "with --overwrite and without --resume") from None


def save_artifact(artifact: Mapping[str, Any], path: Path) -> Path:
    atomic_write_bytes(Path(path), artifact_bytes(artifact))
    return Path(path)


def load_artifact(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path} is not an AWQ search artifact: qcal reads only "
                              f"{ARTIFACT_NAME} files (older .pt artifacts: re-run the search)")
    head, tensors = _read(path, "AWQ search artifact")
    if not isinstance(head, dict) or head.get("format") != ARTIFACT_FORMAT:
        raise CheckpointError(f"{path} is not a qcal AWQ search artifact")
    try:
        head["layers"] = [_unflatten(e, f"layers.{i}.", tensors) for i, e in enumerate(head["layers"])]
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"AWQ search artifact {path} is incomplete ({err}); re-run the "
                              "search") from None
    return head
