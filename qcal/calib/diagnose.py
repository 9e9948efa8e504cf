"""`qcal calib diagnose`: is a calibration set good, before anything is quantized?

Three parts, each usable alone:
- `text_report`: windows and tokens, the share per language and per source document,
  exact and near-duplicate windows (MinHash over word 5-gram shingles, datasketch's LSH),
  the Zipf statistics the manifest holds, and whether the model's chat template's markers
  occur (a chat-format set).
- `leakage_report`: the share of each evaluation split's word 13-grams the set contains
  (qcal.calib.leakage), for the held-out chapters of the packaged corpus in every language
  and every provisioned lm-eval task; a split at or above 1% is flagged.
- `model_report`: one pass over the float model's decoder layers, memory bounded by one
  layer (each read from the files when the model streams), feeding the set's windows and a
  target's windows side by side. For sampled layers and each distinct linear input: the
  share of the target's highest-energy input channels (its top 1% by E[x^2]) that the set
  excites at less than half the target's relative energy, the overlap of the two Hessians'
  top-16 eigenspaces, and the predicted damage: each linear quantized by GPTQ with the
  set's Hessian, its output error measured on the target's Hessian, tr(dW H_t dW^T),
  relative to quantizing with the target's own Hessian (1 is as good as calibrating on the
  target; higher is worse).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from qcal.calib.io import CalibSet
from qcal.calib.leakage import overlap, words
from qcal.model.arch import decoder_layers
from qcal.model.capture import capture_layer0_inputs, feed_linear_inputs, run_layer
from qcal.model.offload import DiskWeights
from qcal.model.resolve import arch_for
from qcal.model.sequential import layer_linear
from qcal.model.stream import free_layer, is_streamed
from qcal.quant.gptq import gptq_quantize
from qcal.quant.hessian import accumulate_hessian, hessian_loss

SHINGLE = 5
NEAR_DUPLICATE = 0.8  # Jaccard similarity of two windows' shingle sets
TOP_EIGEN = 16
TOP_CHANNELS = 0.01
UNDER_EXCITED = 0.5


def decoded(calib: CalibSet, tokenizer: Any) -> list[str]:
    """The set's windows as text (special tokens dropped)."""
    return [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in calib.input_ids]


def near_duplicates(texts: Sequence[str], threshold: float = NEAR_DUPLICATE) -> list[list[int]]:
    """Pairs of windows whose word-shingle sets have a MinHash Jaccard estimate at or above
    `threshold` (datasketch's MinHash LSH; 128 permutations, seeded)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    hashes = []
    for i, text in enumerate(texts):
        seq = words(text)
        grams = {" ".join(seq[j:j + SHINGLE]) for j in range(max(1, len(seq) - SHINGLE + 1))}
        m = MinHash(num_perm=128, seed=1)
        for gram in grams:
            m.update(gram.encode())
        hashes.append(m)
        lsh.insert(str(i), m)
    pairs = set()
    for i, m in enumerate(hashes):
        for j in map(int, lsh.query(m)):
            if j != i and hashes[i].jaccard(hashes[j]) >= threshold:
                pairs.add((min(i, j), max(i, j)))
    return [list(p) for p in sorted(pairs)]


def text_report(calib: CalibSet, tokenizer: Any, texts: Sequence[str] | None = None
                ) -> dict[str, Any]:
    """`texts`: the windows decoded (decoded here when not given)."""
    samples = calib.manifest.get("samples") or []
    langs = Counter(s.get("lang") or "?" for s in samples)
    docs = Counter(d for s in samples for d in s.get("documents", []))
    rows = [hashlib.sha256(r.numpy().tobytes()).hexdigest() for r in calib.input_ids]
    exact = sum(n - 1 for n in Counter(rows).values() if n > 1)
    texts = decoded(calib, tokenizer) if texts is None else texts
    template = getattr(tokenizer, "chat_template", None)
    # The template's own markers (<|im_start|>...), not the document separators every
    # packed window holds (EOS, BOS, padding).
    plain = {getattr(tokenizer, k, None) for k in ("eos_token", "bos_token", "pad_token",
                                                    "unk_token")}
    markers = [t for t in getattr(tokenizer, "all_special_tokens", []) or []
               if template and t in template and t not in plain]
    raw = [tokenizer.decode(r.tolist()) for r in calib.input_ids] if markers else []
    return {
        "windows": calib.nsamples, "seqlen": calib.seqlen,
        "tokens": int(calib.input_ids.numel()),
        "language_share": {k: v / max(1, len(samples)) for k, v in sorted(langs.items())},
        "documents": len(docs), "max_windows_per_document": max(docs.values(), default=0),
        "exact_duplicate_windows": exact,
        "near_duplicate_pairs": near_duplicates(texts),
        "statistics": calib.manifest.get("statistics", {}),
        "chat_markers": markers,
        "windows_with_chat_markers": sum(any(m in t for m in markers) for t in raw),
    }


def evaluation_splits(langs: Sequence[str] | None = None, source: str = "debian-handbook",
                      tasks: Sequence[str] | None = None) -> dict[str, list[str]]:
    """{split name: its documents' texts}: the packaged corpus's held-out chapters per
    language (`langs`; None: all), and the provisioned lm-eval tasks' documents (each string
    field of a row) of `tasks` (a group name covers its subtasks; None: every task)."""
    import json

    from qcal.data.corpus import available_languages, load_documents
    from qcal.eval.benchmarks import benchmarks_dir

    splits: dict[str, list[str]] = {}
    for lang in langs or available_languages(source):
        splits[f"{source}/eval/{lang}"] = [d.text for d in load_documents(source, [lang],
                                                                            split="eval")]
    root = benchmarks_dir()
    for path in sorted(root.glob("*/*.jsonl")) if root.is_dir() else []:
        task = path.parent.name
        if tasks is not None and not any(task == t or task.startswith(t + "_") for t in tasks):
            continue
        docs = []
        # "\n" only: str.splitlines also splits at U+2028 and friends inside JSON strings.
        for line in path.read_text(encoding="utf-8").split("\n"):
            if not line.strip():
                continue
            row = json.loads(line)
            docs.append(" ".join(_strings(row)))
        splits[f"{path.parent.name}/{path.stem}"] = docs
    return splits


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def leakage_report(calib: CalibSet, tokenizer: Any, splits: Mapping[str, Sequence[str]],
                   texts: Sequence[str] | None = None) -> dict[str, Any]:
    """`texts`: the windows decoded (decoded here when not given)."""
    per_split = overlap(decoded(calib, tokenizer) if texts is None else texts, splits)
    return {"splits": per_split, "flagged": sorted(k for k, v in per_split.items() if v["flagged"])}


@dataclasses.dataclass
class _Stats:
    """Running H = 2 E[x x^T] of one linear input (its diagonal is the channels' energy)."""

    hessian: torch.Tensor | None = None
    count: int = 0

    def add(self, x: torch.Tensor) -> None:
        self.hessian, self.count = accumulate_hessian(x.reshape(-1, x.shape[-1]).float(),
                                                      self.hessian, self.count)


def compare_inputs(set_h: torch.Tensor, target_h: torch.Tensor) -> dict[str, float]:
    """How the set's input statistics miss the target's (pure): the share of the target's
    top-1% energy channels the set under-excites, and the top-16 eigenspace overlap."""
    e_set = set_h.diagonal() / set_h.diagonal().sum().clamp_min(1e-30)
    e_tgt = target_h.diagonal() / target_h.diagonal().sum().clamp_min(1e-30)
    k = max(1, int(round(TOP_CHANNELS * e_tgt.numel())))
    top = torch.topk(e_tgt, k).indices
    under = float((e_set[top] < UNDER_EXCITED * e_tgt[top]).float().mean())
    r = min(TOP_EIGEN, set_h.shape[0])
    u_set = torch.linalg.eigh(set_h.double())[1][:, -r:]
    u_tgt = torch.linalg.eigh(target_h.double())[1][:, -r:]
    return {"under_excited_top_channels": under,
            "eigenspace_overlap": float((u_set.T @ u_tgt).pow(2).sum() / r)}


def _quantized(weight: torch.Tensor, hessian: torch.Tensor, cfg: Any) -> torch.Tensor:
    return gptq_quantize(weight, hessian, cfg, with_loss=False).dequantize()


def predicted_damage(weight: torch.Tensor, set_h: torch.Tensor, target_h: torch.Tensor,
                     cfg: Any, with_set: torch.Tensor | None = None) -> float:
    """tr(dW H_t dW^T) with dW from GPTQ on the set's Hessian, over the same with GPTQ on the
    target's own (pure); `with_set`: the first GPTQ result when the caller has it."""
    with_set = _quantized(weight, set_h, cfg) if with_set is None else with_set
    own = hessian_loss(weight, _quantized(weight, target_h, cfg), target_h)
    return hessian_loss(weight, with_set, target_h) / own if own > 0 else float("nan")


@torch.no_grad()
def model_report(model: nn.Module, calib_ids: torch.Tensor, targets: Mapping[str, torch.Tensor],
                 layers: Sequence[int], cfg: Any, weights_dir: Any = None,
                 device: str = "cpu") -> dict[str, Any]:
    """{target: per sampled layer and linear, compare_inputs and predicted_damage, and their
    mean damage}, every target in the same pass over the layers (the set's GPTQ result is
    computed once per linear); `cfg` is the GPTQConfig whose scheme the damage is for."""
    arch = arch_for(model)
    blocks = decoder_layers(model, arch)
    wanted = sorted({i for i in layers if 0 <= i < len(blocks)})
    streams = {"": capture_layer0_inputs(model, arch, calib_ids, device=device)}
    streams.update({name: capture_layer0_inputs(model, arch, ids, device=device)
                    for name, ids in targets.items()})
    disk = DiskWeights(weights_dir) if weights_dir is not None and is_streamed(model) else None
    per_target: dict[str, dict[str, Any]] = {name: {} for name in targets}
    for index in range(wanted[-1] + 1 if wanted else 0):
        if disk is not None:
            disk.load_into(blocks[index], f"{arch.layers_path}.{index}.")
        layer = blocks[index].to(device)
        if index in wanted:
            for name, rep in _layer_report(layer, arch, streams, index, cfg, device).items():
                per_target[name][str(index)] = rep
        for role, inputs in streams.items():
            streams[role] = dataclasses.replace(inputs, hidden=run_layer(
                layer, inputs.for_layer(index), device, inplace=True))
        if disk is not None:
            free_layer(blocks, index)
    out = {}
    for name, per_layer in per_target.items():
        damages = [v["predicted_damage"] for lay in per_layer.values() for v in lay.values()]
        out[name] = {"layers": per_layer, "predicted_damage":
                     float(torch.tensor(damages).mean()) if damages else float("nan")}
    return out


def _layer_report(layer: nn.Module, arch: Any, streams: dict[str, Any], index: int, cfg: Any,
                  device: str) -> dict[str, dict[str, Any]]:
    """{target: {linear: statistics}} of one layer; the set is the stream named ""."""
    out: dict[str, dict[str, Any]] = {role: {} for role in streams if role}
    for step in arch.sequential:
        stats = {role: {n: _Stats() for n in step} for role in streams}
        for role, inputs in streams.items():
            feed_linear_inputs(layer, inputs.for_layer(index), step,
                               lambda name, x, mine=stats[role]: mine[name].add(x), device)
        for name in step:
            weight = layer_linear(layer, name).weight
            set_h = stats[""][name].hessian
            with_set = _quantized(weight, set_h, cfg)
            for role in out:
                target_h = stats[role][name].hessian
                out[role][name] = {**compare_inputs(set_h, target_h),
                                   "predicted_damage": predicted_damage(weight, set_h, target_h,
                                                                        cfg, with_set)}
    return out
