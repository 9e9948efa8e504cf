"""`qcal eval` as a library call: perplexity, lm-eval tasks, calibration and drift.

`run_evaluation` loads the model (and, for drift, its float base), measures what the
`EvalConfig` asks for, and returns an `EvalOutcome`; `write_outputs` turns it into
results JSON + Markdown, a reliability diagram, per-item records and token NLLs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qcal.config import to_dict
from qcal.errors import ConfigError
from qcal.eval import confidence as cm
from qcal.eval.drift import item_drift, metric_deltas
from qcal.eval.harness import ItemRecord
from qcal.run_config import EvalConfig

ROLES = ("model", "base")


@dataclasses.dataclass
class EvalOutcome:
    data: dict[str, Any]  # everything that goes into the results JSON
    token_nll: dict[str, torch.Tensor]  # "<role>/<lang>" -> token NLL stream
    items: dict[str, dict[str, list[ItemRecord]]]  # role -> task -> items


def describe_model(path: Path) -> dict[str, Any]:
    """Label for tables and plots: name, path, and for a checkpoint its method and calib set."""
    raw = json.loads((Path(path) / "config.json").read_text())
    qc = raw.get("quantization_config") or {}
    out: dict[str, Any] = {"name": Path(path).name, "path": str(path),
                           "quantized": bool(qc), "architecture": (raw.get("architectures") or
                                                                   ["?"])[0]}
    if qc:
        from qcal.packing.checkpoint import checkpoint_summary

        summary = checkpoint_summary(path)  # any format: compressed-tensors has no GPTQ fields
        out.update({k: summary[k] for k in ("method", "bits", "group_size", "sym", "desc_act",
                                            "source_model")})
        out["calibration_set"] = calibration_label(summary["calibration"])
    return out


def calibration_label(manifest: Any) -> str:
    if not manifest:
        return "none (no calibration data used)"
    if not isinstance(manifest, dict):
        return str(manifest)
    keys = ("name", "selector", "source", "sources", "langs", "nsamples", "n", "seqlen", "seed",
            "digest")
    parts = [f"{k}={manifest[k]}" for k in keys if k in manifest and manifest[k] is not None]
    return ", ".join(parts) or json.dumps(manifest, default=str)[:200]


def _texts(cfg: EvalConfig, text_file: Path | None) -> dict[str, str]:
    if text_file is not None:
        if not Path(text_file).is_file():
            raise ConfigError(f"--text file {text_file} does not exist")
        from qcal.data.sources import read_user_text

        return {"file": read_user_text(Path(text_file))}
    from qcal.data import eval_text

    if not cfg.langs:
        raise ConfigError("no languages to evaluate; pass --langs (e.g. en or en,de,fr)")
    return {lang: eval_text(lang, source=cfg.source) for lang in cfg.langs}


def _perplexity(cfg: EvalConfig, texts: dict[str, str], net: Any, tok: Any, base: Any,
                progress: bool) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from qcal.eval.divergence import compare_on_ids
    from qcal.eval.perplexity import perplexity_of_ids, tokenize_text
    from qcal.tokenization import text_prefix

    prefix = text_prefix(tok)
    ppl: dict[str, Any] = {"model": {}, "base": {}, "divergence": {}}
    streams: dict[str, torch.Tensor] = {}
    for lang, text in texts.items():
        ids = tokenize_text(tok, text)
        if base is None:
            res = perplexity_of_ids(net, ids, cfg.seqlen, cfg.stride, cfg.batch_size,
                                    cfg.max_windows, progress, desc=f"ppl[{lang}]", prefix=prefix)
            ppl["model"][lang] = res.summary()
            streams[f"model/{lang}"] = res.token_nll
            continue
        drift = compare_on_ids(base, net, ids, cfg.seqlen, cfg.stride, cfg.max_windows, progress,
                               desc=f"ppl+kl[{lang}]", prefix=prefix)
        ppl["model"][lang] = drift.model.summary()
        ppl["base"][lang] = drift.base.summary()
        ppl["divergence"][lang] = drift.summary()
        for row in ppl["divergence"][lang].get("localization", {}).get("top_tokens", []):
            row["token"] = tok.decode([row["token_id"]])
        streams[f"model/{lang}"] = drift.model.token_nll
        streams[f"base/{lang}"] = drift.base.token_nll
        streams[f"kl/{lang}"] = drift.kl
        streams[f"js/{lang}"] = drift.js
        if drift.kl_reverse is not None:
            streams[f"kl_reverse/{lang}"] = drift.kl_reverse
    return ppl, streams


def probs_of(items: Sequence[ItemRecord], norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """[items, choices] p (raw, or per-character length-normalised) and gold indices."""
    lls = [r.lls for r in items]
    probs = cm.stack_probs(lls, [r.lengths for r in items] if norm else None)
    return probs, np.array([r.gold for r in items], dtype=np.int64)


def _align(a: list[ItemRecord], b: list[ItemRecord], task: str) -> None:
    if [r.doc_id for r in a] != [r.doc_id for r in b] or [r.gold for r in a] != [r.gold for r in b]:
        raise ConfigError(f"task {task}: the model and --base scored different items; run both "
                          "with the same tasks, --limit and --num-fewshot")


def _calibration(cfg: EvalConfig, items: dict[str, dict[str, list[ItemRecord]]],
                 lm_metrics: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    calib: dict[str, Any] = {}
    drift: dict[str, Any] = {}
    for task, recs in items["model"].items():
        calib[task] = {}
        for role in ROLES:
            if task not in items.get(role, {}):
                continue
            calib[task][role] = {}
            for kind, norm in (("raw", False), ("norm", True)):
                probs, gold = probs_of(items[role][task], norm)
                calib[task][role][kind] = cm.confidence_metrics(probs, gold, cfg.ece_bins)
            calib[task][role]["lm_eval_acc"] = lm_metrics[role].get(task, {}).get("acc,none")
        if task in items.get("base", {}):
            _align(recs, items["base"][task], task)
            drift[task] = {}
            for kind, norm in (("raw", False), ("norm", True)):
                bp, gold = probs_of(items["base"][task], norm)
                mp, _ = probs_of(recs, norm)
                drift[task][kind] = {
                    "metric_deltas": metric_deltas(calib[task]["base"][kind],
                                                   calib[task]["model"][kind]),
                    **item_drift(bp, mp, gold),
                }
    return calib, drift


def _score_store(score_file: Path | None, score_dir: Path | None, model_dir: Path | None,
                 net: Any, device: str) -> Any:
    """The ScoreStore of one model's lm-eval requests (None: scores are not kept)."""
    if net is None or model_dir is None or (score_file is None and score_dir is None):
        return None
    from qcal.eval.score_store import ScoreStore, model_identity

    identity = model_identity(model_dir)
    path = score_file if score_file is not None else Path(score_dir or ".") / f"{identity}.jsonl"
    return ScoreStore(path, {"model": identity, "device": str(device),
                             "dtype": str(next(net.parameters()).dtype)})


def run_evaluation(
    model: str | Path | None, cfg: EvalConfig, base: str | Path | None = None,
    text_file: Path | None = None, include_paths: Sequence[Path | str] = (), progress: bool = True,
    trust_remote_code: bool = False, device: str = "auto", backend: str = "hf",
    score_file: Path | None = None, score_dir: Path | None = None,
) -> EvalOutcome:
    """Measure `model` (float dir or qcal checkpoint), and its drift from `base` if given.

    `score_file` keeps the model's lm-eval scores as they are computed
    (`qcal.eval.score_store`), so a run interrupted mid-way resumes from there;
    `score_dir` keeps the model's and the base's, each in a file named by its model's
    fingerprint, so evals of several checkpoints against one base score the base once."""
    from qcal.devices import resolve_device
    from qcal.model.loading import load_model, resolve_model_dir

    device = resolve_device(device)  # a device that is not there fails before anything else
    if backend not in ("hf", "vllm"):
        raise ConfigError(f"--backend {backend!r} is unknown; use hf (default) or vllm")
    if backend == "vllm":
        return _run_vllm(model, cfg, include_paths, base, trust_remote_code)
    tm, tasks = None, []
    if cfg.tasks:  # resolve tasks and check item files before any model loads
        from qcal.eval.harness import resolve_tasks, task_manager

        tm = task_manager(include_paths, cfg.tasks, trust_code=trust_remote_code)
        tasks = resolve_tasks(cfg.tasks, tm, include_paths)
    texts = _texts(cfg, text_file) if cfg.ppl else {}
    model_dir = resolve_model_dir(model, trust_remote_code)
    base_dir = resolve_model_dir(base, trust_remote_code) if base is not None else None
    net, tok, _ = load_model(model_dir, trust_remote_code=trust_remote_code)
    net.to(device)
    base_net = (load_model(base_dir, trust_remote_code=trust_remote_code)[0].to(device)
                if base_dir is not None else None)

    data: dict[str, Any] = {
        "model": describe_model(model_dir),
        "base": describe_model(base_dir) if base_dir is not None else None,
        "settings": {**to_dict(cfg), "device": device,
                     "text_file": str(text_file) if text_file else None,
                     "include_paths": [str(p) for p in include_paths]},
    }
    token_nll: dict[str, torch.Tensor] = {}
    if texts:
        ppl, token_nll = _perplexity(cfg, texts, net, tok, base_net, progress)
        data["perplexity"] = ppl
        data["data"] = (f"{cfg.source} eval split ({', '.join(texts)})" if text_file is None
                        else str(text_file))
    items: dict[str, dict[str, list[ItemRecord]]] = {}
    if tasks:
        from qcal.eval.harness import run_tasks

        lm_metrics: dict[str, dict[str, Any]] = {}
        lm_info: dict[str, Any] = {}
        continuations: dict[str, list[dict[str, Any]]] = {}
        stores = {"model": _score_store(score_file, score_dir, model_dir, net, device),
                  "base": _score_store(None, score_dir, base_dir, base_net, device)}
        # The base first: it is the same for every checkpoint compared with it, so its store
        # (keyed by content) is the one a later run, on any machine, is likeliest to reuse.
        for role, m in (("base", base_net), ("model", net)):
            if m is None:
                continue
            run = run_tasks(m, tok, tasks, tm, cfg.task_batch_size, cfg.limit, cfg.num_fewshot,
                            desc=role, task_limits=dict(cfg.task_limits),
                            score_store=stores[role])
            lm_metrics[role], items[role], lm_info = run.metrics, run.items, run.info
            if role == "model":
                continuations = run.continuations
        data["lm_eval"] = {"tasks": tasks, "results": lm_metrics, "info": lm_info}
        if continuations:
            data["lm_eval"]["continuation_items"] = continuations
        if base_net is not None:
            data["lm_eval"]["deltas"] = {
                t: {k: v for k, v in metric_deltas(lm_metrics["base"].get(t, {}),
                                                   lm_metrics["model"][t]).items()
                    if "stderr" not in k and k != "sample_len"}
                for t in lm_metrics["model"]
            }
        if cfg.confidence or base_net is not None:
            if not items.get("model"):
                raise ConfigError(f"none of {tasks} is a multiple-choice task; confidence "
                                  "metrics need per-choice log-likelihoods")
            data["calibration"], drift = _calibration(cfg, items, lm_metrics)
            if drift:
                data["drift"] = drift
    return EvalOutcome(data, token_nll, items)


def _run_vllm(model: str | Path | None, cfg: EvalConfig, include_paths: Sequence[Path | str],
              base: str | Path | None, trust_remote_code: bool) -> EvalOutcome:
    """lm-eval tasks through vLLM on the checkpoint directory (no perplexity, no drift)."""
    from qcal.eval.harness import resolve_tasks, run_tasks, task_manager, vllm_lm
    from qcal.model.loading import load_tokenizer, resolve_model_dir

    if cfg.ppl or not cfg.tasks or base is not None:
        raise ConfigError("--backend vllm runs lm-eval --tasks only; perplexity and drift "
                          "(--base) run on the hf backend")
    model_dir = resolve_model_dir(model, trust_remote_code)
    tm = task_manager(include_paths, cfg.tasks, trust_code=trust_remote_code)
    tasks = resolve_tasks(cfg.tasks, tm, include_paths)
    run = run_tasks(vllm_lm(model_dir, cfg.task_batch_size), load_tokenizer(model_dir), tasks, tm,
                    cfg.task_batch_size, cfg.limit, cfg.num_fewshot, desc="vllm",
                    task_limits=dict(cfg.task_limits))
    data = {"model": describe_model(model_dir), "base": None,
            "settings": {**to_dict(cfg), "backend": "vllm"},
            "lm_eval": {"tasks": tasks, "results": {"model": run.metrics}, "info": run.info}}
    if run.continuations:
        data["lm_eval"]["continuation_items"] = run.continuations
    return EvalOutcome(data, {}, {"model": run.items})


def non_finite_metrics(data: dict[str, Any]) -> list[str]:
    """Where the results hold NaN/Inf perplexity or accuracy: a broken model, not a finding."""
    bad = []
    for role in ROLES:
        for lang, row in ((data.get("perplexity") or {}).get(role) or {}).items():
            if not np.isfinite(row.get("ppl", 0.0)):
                bad.append(f"{role} perplexity[{lang}]={row.get('ppl')}")
    for role, res in ((data.get("lm_eval") or {}).get("results") or {}).items():
        for task, metrics in res.items():
            for key, value in metrics.items():
                if isinstance(value, float) and not np.isfinite(value) and "stderr" not in key:
                    bad.append(f"{role} {task} {key}={value}")
    return bad
