"""The confidence study's numbers, from the cells of a seeded grid with benchmark tasks.

Pure functions of cell records (no files). Per task and method: lm-eval's own accuracy
(with its stderr and item count), the calibration metrics of the raw choice
probabilities (accuracy, ECE, Brier, NLL, gold-answer confidence) as the mean over
calibration seeds with a 95% interval, and the drift from the float model on the same
items: paired tests of gold-answer confidence and accuracy, and the per-quartile table
(quartiles of the *float* model's gold-answer confidence) behind the published claim that
4-bit GPTQ lowers confidence on the gold answer mostly where the float model was already
unsure. That claim is tested as a contrast: the change in the least confident quartile
against the change in the other three (Welch's t-test), on two scales: probability, as the
claim is worded, and the gold answer's log-odds, which has no floor or ceiling (on
probabilities the unsure items can hardly lose and the sure ones hardly gain, whatever
quantization does; see qcal.eval.drift). On each scale a rank test (Mann-Whitney U) checks
that a few extreme items do not make the verdict (log-odds changes have long tails). Each
family of tests over all tasks and methods (the gold-answer confidence changes, and each
contrast: scale x test) is Holm-adjusted, and the verdicts read the adjusted tests. A
calibrated method's item probabilities are averaged over its seeds first (the expected
model of a random calibration draw; gold-answer confidence is linear in them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from qcal.eval.confidence import confidence_metrics
from qcal.eval.drift import gold_changes, item_drift
from qcal.eval.stats import (
    mean_ci,
    paired_mean_test,
    rank_shift_test,
    significant,
    test_p,
    two_sample_mean_test,
    with_holm,
)
from qcal.grid.evidence import model_lm_eval, seed_sorted
from qcal.grid.report import float_key, item_probs
from qcal.grid.spec import FLOAT_CELL

METRICS = ("acc", "ece", "brier", "nll", "conf_true")
CLAIM = ("published claim: 4-bit GPTQ lowers confidence on the gold answer, mostly where the "
         "float model was already unsure")
SCALES = {"p": "probability", "log_odds": "log-odds"}  # the contrast's scales, in table order
RANKS = "_ranks"  # suffix of a scale's rank-test contrast
# The contrasts (Welch t on each scale, then the rank test on each), and where each verdict
# is kept in a drift entry.
CONTRASTS = {**SCALES, **{s + RANKS: f"{label}, ranks" for s, label in SCALES.items()}}
CLAIM_KEYS = {"p": "claim", "log_odds": "claim_log_odds", "p" + RANKS: "claim_ranks",
              "log_odds" + RANKS: "claim_log_odds_ranks"}


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
    conf_b, conf_m = base[0][rows, gold], probs[rows, gold]
    conf_test = paired_mean_test(conf_m, conf_b)
    quartiles = np.array_split(np.argsort(conf_b, kind="stable"), 4)
    quartile_tests = [paired_mean_test(conf_m[idx], conf_b[idx]) if idx.size > 1 else None
                      for idx in quartiles]
    changes = gold_changes(base[0], probs, gold)
    unsure, rest = quartiles[0], np.concatenate(quartiles[1:])
    unsure_vs_rest: dict[str, dict[str, Any]] = {}
    if unsure.size > 1 and rest.size > 1:
        for scale, change in changes.items():
            unsure_vs_rest[scale] = two_sample_mean_test(change[unsure], change[rest])
            unsure_vs_rest[scale + RANKS] = rank_shift_test(change[unsure], change[rest])
    return {"seeds": len(runs), "drift": drift, "acc_test": acc_test, "conf_true_test": conf_test,
            "quartile_tests": quartile_tests, "unsure_vs_rest": unsure_vs_rest}


def quartile_claim(drift: dict[str, Any], contrast: str = "p") -> str:
    """Does the loss of gold-answer confidence concentrate where the float model was unsure?

    'no drop' without a significant overall drop; then, from the contrast of the least
    confident quartile's change against the other three's (`contrast`, a key of CONTRASTS:
    the scale, and the rank test when it ends in RANKS): 'agrees' when it
    loses significantly more, 'disagrees' when significantly less, 'not shown' when the
    difference is not significant. Tests that went through Holm are read after it."""
    test = drift["conf_true_test"]
    if not (significant(test) and test["delta"] < 0):
        return "no drop"
    tested = drift["unsure_vs_rest"].get(contrast)
    if tested is None or not significant(tested):
        return "not shown"
    return "agrees" if tested["delta"] < 0 else "disagrees"


def _contrast_p(test: dict[str, Any]) -> float:
    if "p" in test:  # rank test
        return test_p(test)
    # No variance in either group leaves nothing to test: as no difference.
    return 1.0 if test["p_ttest"] is None else test["p_ttest"]


def _holm_over_study(out: dict[str, Any]) -> None:
    """Holm over every task and method, per family: the gold-answer confidence changes
    (t-test p) and each unsure-vs-rest contrast (scale x test); then the claims."""
    drifts = [entry["drift"] for per_method in out.values() for entry in per_method.values()
              if "drift" in entry]
    tested = [d for d in drifts if d["conf_true_test"]["p_ttest"] is not None]
    adjusted = with_holm([d["conf_true_test"] for d in tested], p_of=lambda t: t["p_ttest"])
    for drift, test in zip(tested, adjusted, strict=True):
        drift["conf_true_test"] = test
    for contrast in CONTRASTS:
        family = [d for d in drifts if contrast in d["unsure_vs_rest"]]
        adjusted = with_holm([d["unsure_vs_rest"][contrast] for d in family], p_of=_contrast_p)
        for drift, test in zip(family, adjusted, strict=True):
            drift["unsure_vs_rest"] = {**drift["unsure_vs_rest"], contrast: test}
    for drift in drifts:
        drift.update({key: quartile_claim(drift, contrast)
                      for contrast, key in CLAIM_KEYS.items()})


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
                entry["drift"] = drift
            per_method[method] = entry
        out[task] = per_method
    _holm_over_study(out)
    return out


def _rank_check(per_task: dict[str, Any]) -> list[str]:
    """A bullet on whether the rank test (Mann-Whitney U) reaches the Welch t-test's verdict
    on each scale, naming the cases where it does not. Only significant drops count: without
    one both verdicts are 'no drop' whatever the contrasts say."""
    same, differ = 0, []
    for task, per_method in per_task.items():
        for method, entry in per_method.items():
            drift = entry.get("drift")
            for scale in SCALES if drift else ():
                welch, ranks = drift[CLAIM_KEYS[scale]], drift[CLAIM_KEYS[scale + RANKS]]
                if welch == "no drop":
                    continue
                if welch == ranks:
                    same += 1
                else:
                    differ.append(f"{task}/{method} in {SCALES[scale]}: {welch} on means, "
                                  f"{ranks} on ranks")
    if not same + len(differ):
        return []
    return [f"- **ranks**: the rank test (Mann-Whitney U on the same changes, Holm) reaches the "
            f"t-test's verdict in {same} of the {same + len(differ)} (significant drop x "
            "scale) cases"
            + (f"; it differs in {'; '.join(differ)}" if differ else
               ", so no verdict rests on a few extreme items") + "."]


def findings(per_task: dict[str, Any]) -> list[str]:
    """The study's findings as Markdown bullets, from `study`'s output: per method, where
    its loss of gold-answer confidence sits against the published claim on each scale,
    then how many drops survive Holm's correction over every task and method."""
    out = []
    labels = sorted({m for pm in per_task.values() for m in pm if m != "float"})
    verdicts = ("agrees", "disagrees", "not shown", "no drop")
    for method in labels:
        drifts = {task: pm[method]["drift"] for task, pm in per_task.items()
                  if method in pm and "drift" in pm[method]}
        if not drifts:
            continue
        parts = []
        for scale, label in SCALES.items():
            claims = {task: d[CLAIM_KEYS[scale]] for task, d in drifts.items()}
            counts = ", ".join(f"{c} {sum(v == c for v in claims.values())}" for c in verdicts)
            parts.append(f"in {label}: {counts} ("
                         + ", ".join(f"{t}: {c}" for t, c in claims.items()) + ")")
        out.append(f"- **{method}**: does the float model's least confident quartile lose more "
                   f"gold-answer confidence than the other three ({CLAIM}; Welch t-test, Holm "
                   f"over tasks and models)? Of {len(drifts)} tasks, " + "; ".join(parts) + ".")
    out += _rank_check(per_task)
    tests = [entry["drift"]["conf_true_test"] for pm in per_task.values()
             for entry in pm.values() if "p_holm" in entry.get("drift", {}).get("conf_true_test", {})]
    drops = [t for t in tests if t["delta"] < 0 and t["p_ttest"] < 0.05]
    kept = [t for t in drops if t["significant_holm"]]
    if tests:
        out.append(f"- **multiple comparisons**: {len(drops)} of {len(tests)} task x model "
                   f"gold-answer confidence changes are drops with t-test p < 0.05; "
                   f"{len(kept)} remain{'s' if len(kept) == 1 else ''} after Holm's correction over "
                   f"all {len(tests)}.")
        out.append("- **scale**: a probability near 0 can hardly fall and one near 1 can hardly "
                   "rise, so even a change that is symmetric in the model's scores makes the "
                   "least confident quartile gain and the most confident lose; on probabilities "
                   "a 'disagrees' is partly built in. The log-odds verdict is free of that floor "
                   "and ceiling.")
    return out
