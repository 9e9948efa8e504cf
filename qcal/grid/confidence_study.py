"""The confidence study's numbers, from the cells of a seeded grid with benchmark tasks.

Pure functions of cell records (no files). Per task and method: lm-eval's own accuracy
(with its stderr and item count), the calibration metrics of the raw choice
probabilities (accuracy, ECE, Brier, NLL, gold-answer confidence) as the mean over
calibration seeds with a 95% interval, and the drift from the float model on the same
items: paired tests of gold-answer confidence and accuracy, and the per-quartile table
(quartiles of the *float* model's gold-answer confidence) behind the published claim that
4-bit GPTQ lowers confidence on the gold answer mostly where the float model was already
unsure. The gold-answer confidence tests of all tasks and methods are one Holm family
(`p_holm` beside the t-test's p). A calibrated method's item probabilities are averaged
over its seeds first (the expected model of a random calibration draw; gold-answer
confidence is linear in them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from qcal.eval.confidence import confidence_metrics
from qcal.eval.drift import item_drift
from qcal.eval.stats import mean_ci, paired_mean_test, with_holm
from qcal.grid.evidence import model_lm_eval, seed_sorted
from qcal.grid.report import float_key, item_probs
from qcal.grid.spec import FLOAT_CELL

METRICS = ("acc", "ece", "brier", "nll", "conf_true")
CLAIM = ("published claim: 4-bit GPTQ lowers confidence on the gold answer, mostly where the "
         "float model was already unsure")


def by_method(cells: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """{label: [cell per seed, in seed order]} for the quantized cells (float excluded); the
    label is the method, with the selector appended unless it is random (or none)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in cells.values():
        method, selector = rec.get("method"), rec.get("selector")
        if method is not None:
            label = method if selector in (None, "random") else f"{method}/{selector}"
            groups[label].append(rec)
    return dict(seed_sorted(groups))


def lm_eval_scores(rec: dict[str, Any], task: str) -> dict[str, Any]:
    """lm-eval's own acc / acc_norm with stderr and item count for one cell and task."""
    row = model_lm_eval(rec)["results"].get(task) or {}
    out = {"n": row.get("sample_len")}
    for metric in ("acc", "acc_norm"):
        if f"{metric},none" in row:
            out[metric] = row[f"{metric},none"]
            out[f"{metric}_stderr"] = row.get(f"{metric}_stderr,none")
    return out


Probs = tuple[np.ndarray, np.ndarray]  # [items, choices] probabilities, [items] gold


def seed_metrics(runs: list[Probs | None]) -> dict[str, dict[str, Any]]:
    """Per metric: mean_ci over the seeds' calibration metrics (runs without the task
    are left out)."""
    per_seed = [confidence_metrics(*run) for run in runs if run is not None]
    return {m: mean_ci([s[m] for s in per_seed]) for m in METRICS} if per_seed else {}


def drift_from_float(base: Probs | None, runs: list[Probs | None]) -> dict[str, Any] | None:
    """Paired drift of a method (its seeds' item probabilities, averaged) from the float
    model on the same items; None when the items do not line up."""
    if base is None or not runs or any(r is None or r[0].shape != base[0].shape for r in runs):
        return None
    probs, gold = np.mean([r[0] for r in runs], axis=0), base[1]
    if any(not np.array_equal(r[1], gold) for r in runs):
        return None
    drift = item_drift(base[0], probs, gold)
    rows = np.arange(len(gold))
    acc_test = paired_mean_test((probs.argmax(1) == gold).astype(float),
                                (base[0].argmax(1) == gold).astype(float))
    conf_test = paired_mean_test(probs[rows, gold], base[0][rows, gold])
    quartile_tests = []
    order = np.argsort(base[0][rows, gold], kind="stable")
    for idx in np.array_split(order, 4):
        quartile_tests.append(paired_mean_test(probs[idx, gold[idx]], base[0][idx, gold[idx]])
                              if idx.size > 1 else None)
    return {"seeds": len(runs), "drift": drift, "acc_test": acc_test, "conf_true_test": conf_test,
            "quartile_tests": quartile_tests}


def quartile_claim(drift: dict[str, Any]) -> str:
    """Does the loss of gold-answer confidence concentrate where the float model was unsure?

    'agrees' when the mean change is a significant drop overall and the lowest quartile of
    float confidence has the largest drop; 'no drop' when there is no significant drop at
    all; otherwise 'disagrees' (the drop sits elsewhere)."""
    test = drift["conf_true_test"]
    if not (test["significant"] and test["delta"] < 0):
        return "no drop"
    deltas = [q.get("delta_conf_true", 0.0) for q in drift["drift"]["by_base_conf_quantile"]]
    return "agrees" if int(np.argmin(deltas)) == 0 else "disagrees"


def study(cells: dict[str, dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """Everything the confidence tables show, per task: float, then each method."""
    groups = by_method(cells)
    # Once per cell for all tasks (keyed by the record itself: a cell need not carry its key).
    probs = {id(rec): item_probs(rec) for rec in cells.values()}
    float_rec = cells.get(FLOAT_CELL)
    out: dict[str, Any] = {}
    for task in tasks:
        per_method: dict[str, Any] = {}
        if float_rec is not None:
            per_method["float"] = {"lm_eval": lm_eval_scores(float_rec, task),
                                   "metrics": seed_metrics([probs[id(float_rec)].get(task)])}
        for method, recs in sorted(groups.items()):
            runs = [probs[id(rec)].get(task) for rec in recs]
            entry: dict[str, Any] = {
                "seeds": len(recs), "lm_eval": [lm_eval_scores(r, task) for r in recs],
                "metrics": seed_metrics(runs)}
            base = cells.get(float_key(recs[0])) or float_rec
            drift = drift_from_float(probs[id(base)].get(task), runs) if base is not None \
                else None
            if drift is not None:
                entry["drift"] = {**drift, "claim": quartile_claim(drift)}
            per_method[method] = entry
        out[task] = per_method
    drifts = [entry["drift"] for per_method in out.values() for entry in per_method.values()
              if "drift" in entry and entry["drift"]["conf_true_test"]["p_ttest"] is not None]
    adjusted = with_holm([d["conf_true_test"] for d in drifts], p_of=lambda t: t["p_ttest"])
    for drift, test in zip(drifts, adjusted, strict=True):
        drift["conf_true_test"] = test
    return out


def findings(per_task: dict[str, Any]) -> list[str]:
    """The study's findings as Markdown bullets, from `study`'s output: per method, where
    its loss of gold-answer confidence sits against the published claim, then how many
    drops survive Holm's correction over every task and method."""
    out = []
    labels = sorted({m for pm in per_task.values() for m in pm if m != "float"})
    for method in labels:
        claims = {task: pm[method]["drift"]["claim"] for task, pm in per_task.items()
                  if method in pm and "drift" in pm[method]}
        if claims:
            counts = {c: sum(v == c for v in claims.values()) for c in ("agrees", "disagrees",
                                                                        "no drop")}
            out.append(f"- **{method}**: of {len(claims)} tasks, the loss of gold-answer confidence "
                       f"concentrates in the float model's least confident quartile in "
                       f"{counts['agrees']} (agrees with the {CLAIM}), elsewhere in "
                       f"{counts['disagrees']} (disagrees), and there is no significant drop in "
                       f"{counts['no drop']}: " + ", ".join(f"{t}: {c}" for t, c in claims.items())
                       + ".")
    tests = [entry["drift"]["conf_true_test"] for pm in per_task.values()
             for entry in pm.values() if "p_holm" in entry.get("drift", {}).get("conf_true_test", {})]
    drops = [t for t in tests if t["delta"] < 0 and t["p_ttest"] < 0.05]
    kept = [t for t in drops if t["significant_holm"]]
    if tests:
        out.append(f"- **multiple comparisons**: {len(drops)} of {len(tests)} task x model "
                   f"gold-answer confidence changes are drops with t-test p < 0.05; "
                   f"{len(kept)} remain{'s' if len(kept) == 1 else ''} after Holm's correction over "
                   f"all {len(tests)}.")
    return out
