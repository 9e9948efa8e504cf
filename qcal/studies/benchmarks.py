"""The benchmark table: lm-eval's own scores of the float model and each method, per task.

Pure functions of cell records (no files). A requested task that is an lm-eval group
(mmlu, multiemo, qcal_nextsent) gets its group row (lm-eval's aggregate) and one row per
direct subtask (mmlu's four categories, multiemo's languages), from the group structure
lm-eval reported with the float cell's results. Each row gives the items scored, acc and
acc_norm with lm-eval's stderr, and perplexity where the task reports one
(lambada_openai); a method run with several calibration seeds shows their mean, and the
mean of their stderrs. Where the cells kept the items' scores (multiple-choice tasks), a
row also gives two answer shares: `majority`, the share of items whose gold answer is the
most common one (the accuracy of always giving that answer, a baseline lm-eval does not
print), and `top_answer`, the share of items on which the model gives its own most common
answer: near 1, the model answers the same whatever the item, and its accuracy is that
baseline, not skill.

A method's row also carries `acc_test`, the evidence for "this method changes accuracy":
a paired test (qcal.eval.stats.paired_mean_test: bootstrap interval, p-values, d_z) of its
per-item correctness, averaged over its seeds, against the float model's on the same items,
Holm-adjusted over every method row of one model's table (`with_float_tests`). lm-eval's
stderr alone cannot say this: two models scored on the same items are not independent
samples, and their intervals overlap long after a paired difference is significant.
On a single-continuation task (LAMBADA) an item is right when every token of its
continuation is the model's greedy choice (lm-eval's acc there), and the test runs on
those flags where the cells kept them (`continuation_items`; older cells did not).
`findings` turns one model's table into bullets: each method's mean change and the
changes that survive Holm, and the tasks where a model answers at chance or gives one
answer to nearly every item.

`method_pair_tests` puts the methods against each other on the same items (AWQ and GPTQ
against RTN, AWQ against GPTQ), the same paired test on each top-level task, Holm over one
model's pairs: testing each method against float only cannot say which method loses less.
"""

from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import Any

import numpy as np

from qcal.eval.stats import paired_mean_test, significant, with_holm
from qcal.grid.evidence import model_lm_eval
from qcal.grid.spec import FLOAT_CELL
from qcal.studies.confidence import by_method

SCORES = ("acc", "acc_norm", "perplexity")


def task_rows(tasks: list[str], info: dict[str, Any]) -> list[tuple[str, int]]:
    """(task, depth) in table order: each requested task, then its direct subtasks."""
    children = info.get("group_subtasks") or {}
    out = []
    for task in tasks:
        out.append((task, 0))
        out += [(sub, 1) for sub in children.get(task, [])]
    return out


def items_scored(task: str, results: dict[str, Any], info: dict[str, Any]) -> int | None:
    """Items behind a row: lm-eval's own count for a task; summed over a group's tasks."""
    counts = info.get("n_samples") or {}
    if task in counts:
        return int(counts[task]["effective"])
    children = (info.get("group_subtasks") or {}).get(task)
    if children:
        parts = [items_scored(c, results, info) for c in children]
        return sum(p for p in parts if p is not None) if all(p is not None for p in parts) \
            else None
    row = results.get(task) or {}
    return row.get("sample_len")


def scores(results: dict[str, Any], task: str) -> dict[str, float]:
    row = results.get(task) or {}
    out = {}
    for metric in SCORES:
        if f"{metric},none" in row and isinstance(row[f"{metric},none"], (int, float)):
            out[metric] = float(row[f"{metric},none"])
            err = row.get(f"{metric}_stderr,none")
            if isinstance(err, (int, float)):
                out[f"{metric}_stderr"] = float(err)
    return out


def task_items(rec: dict[str, Any], task: str, children: dict[str, list[str]]
               ) -> list[dict[str, Any]]:
    """The items a cell kept for `task` (log-likelihood per choice and gold); a group's are
    its tasks' items, at any depth."""
    own = (rec.get("items") or {}).get(task)
    if own:
        return list(own)
    return [item for sub in children.get(task, []) for item in task_items(rec, sub, children)]


def answer_shares(recs: list[dict[str, Any]], task: str, children: dict[str, list[str]]
                  ) -> dict[str, float]:
    """{'majority': share of items whose gold is the most common gold index, 'top_answer':
    share on which the model picks its most common choice index (mean over seeds),
    'chance': expected accuracy of a uniform guess (mean of 1 / choices)}; empty
    when the cells kept no items for the task. Tasks whose items have different numbers of
    choices count indices all the same: the shares stay shares of items."""
    # A single 'choice' (a plain continuation) has no answer to prefer.
    per_seed = [[it for it in task_items(rec, task, children) if len(it["lls"]) > 1]
                for rec in recs]
    per_seed = [items for items in per_seed if items]
    if not per_seed:
        return {}

    def top_share(indices: list[int]) -> float:
        return max(Counter(indices).values()) / len(indices)

    golds = [int(item["gold"]) for item in per_seed[0]]
    picks = [top_share([int(np.argmax(it["lls"])) for it in items]) for items in per_seed]
    chance = mean(1 / len(item["lls"]) for item in per_seed[0])
    return {"majority": top_share(golds), "top_answer": mean(picks), "chance": chance}


def _correct(items: list[dict[str, Any]]) -> np.ndarray:
    """1.0 where the item's highest log-likelihood choice is the gold one (lm-eval's acc:
    ties go to the first choice, as np.argmax does there)."""
    return np.array([float(int(np.argmax(it["lls"])) == int(it["gold"])) for it in items])


def _continuations(rec: dict[str, Any], task: str) -> list[dict[str, Any]]:
    """A cell's per-item records of a single-continuation task (LAMBADA): {"doc_id", "ll",
    "greedy"}; empty for a cell recorded before qcal kept them."""
    block = (rec.get("eval") or {}).get("lm_eval") or {}
    return list((block.get("continuation_items") or {}).get(task) or [])


def _graded(rec: dict[str, Any], task: str, children: dict[str, list[str]]
            ) -> tuple[list[tuple[Any, Any]], np.ndarray] | None:
    """(each item's identity, 1.0 where lm-eval's acc counts it right) for a cell: the
    multiple-choice items' argmax against gold, or a single-continuation task's greedy
    flag; None when the cell kept neither for `task`."""
    items = task_items(rec, task, children)
    if items:
        if any(len(it["lls"]) < 2 for it in items):
            return None
        return [(it.get("doc_id"), int(it["gold"])) for it in items], _correct(items)
    singles = _continuations(rec, task)
    if singles:
        return ([(it["doc_id"], None) for it in singles],
                np.array([float(it["greedy"]) for it in singles]))
    return None


def _method_scores(recs: list[dict[str, Any]], task: str, children: dict[str, list[str]]
                   ) -> tuple[list[tuple[Any, Any]], np.ndarray] | None:
    """(each item's identity, the share of a method's seeds that answer it right); None
    when a seed kept no per-item records for `task` or the seeds' items do not line up."""
    runs = [_graded(rec, task, children) for rec in recs]
    first = runs[0] if runs else None
    if first is None or any(run is None or run[0] != first[0] for run in runs):
        return None
    return first[0], np.mean([run[1] for run in runs if run is not None], axis=0)


def accuracy_test(float_rec: dict[str, Any], recs: list[dict[str, Any]], task: str,
                  children: dict[str, list[str]]) -> dict[str, Any] | None:
    """Paired test of a method's per-item accuracy (the share of its seeds that answer each
    item right) minus the float model's, over the same items; None when the cells kept no
    per-item records for `task` or the items do not line up (doc and gold answer)."""
    base = _graded(float_rec, task, children)
    method = _method_scores(recs, task, children)
    if base is None or method is None or method[0] != base[0]:
        return None
    return paired_mean_test(method[1], base[1])


def with_float_tests(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with each `acc_test` Holm-adjusted over all of them (one model's table is one
    family: a reader scans every method and task for a difference)."""
    tested = [i for i, r in enumerate(rows) if r.get("acc_test")]
    adjusted = with_holm([rows[i]["acc_test"] for i in tested])
    out = list(rows)
    for i, test in zip(tested, adjusted, strict=True):
        out[i] = {**rows[i], "acc_test": test}
    return out


def benchmark_table(cells: dict[str, dict[str, Any]], tasks: list[str]) -> list[dict[str, Any]]:
    """One row per (task or subtask, model): items, seeds and the mean of each score; a
    method's row has `acc_test` against the float model where items allow (not yet
    Holm-adjusted: `combined_table` does that over the whole table)."""
    float_rec = cells.get(FLOAT_CELL)
    models = ([("float", [float_rec])] if float_rec is not None else []) + sorted(
        by_method(cells).items())
    if not models:
        return []
    layout_info = model_lm_eval(models[0][1][0])["info"]
    children = layout_info.get("group_subtasks") or {}
    rows = []
    for task, depth in task_rows(tasks, layout_info):
        for label, recs in models:
            blocks = [model_lm_eval(r) for r in recs]
            per_seed = [scores(b["results"], task) for b in blocks]
            per_seed = [s for s in per_seed if s]
            if not per_seed:
                continue
            row: dict[str, Any] = {"task": task, "depth": depth, "model": label,
                                   "seeds": len(per_seed),
                                   "items": items_scored(task, blocks[0]["results"],
                                                         blocks[0]["info"])}
            for key in {k for s in per_seed for k in s}:
                values = [s[key] for s in per_seed if key in s]
                row[key] = mean(values)
            row.update(answer_shares(recs, task, children))
            if label != "float" and float_rec is not None:
                test = accuracy_test(float_rec, recs, task, children)
                if test is not None:
                    row["acc_test"] = test
            rows.append(row)
    return rows


def combined_table(sources: list[tuple[dict[str, dict[str, Any]], list[str]]]
                   ) -> list[dict[str, Any]]:
    """`benchmark_table` over several grids of one model, each (cells, tasks); a task comes
    from the first grid that ran it, so no task is scored twice (the benchmark grid leaves
    the confidence grid's tasks to it, seeds and all). Rows say which source they are from
    (`source`: its index). `acc_test`s are Holm-adjusted over all rows."""
    rows = []
    for index, cells, own in _own_tasks(sources):
        rows += [{**row, "source": index} for row in benchmark_table(cells, own)]
    return with_float_tests(rows)


def _own_tasks(sources: list[tuple[dict[str, dict[str, Any]], list[str]]]
               ) -> list[tuple[int, dict[str, dict[str, Any]], list[str]]]:
    """(index, cells, the tasks no earlier source ran) for each source."""
    seen: set[str] = set()
    out = []
    for index, (cells, tasks) in enumerate(sources):
        own = [t for t in tasks if t not in seen]
        seen.update(own)
        out.append((index, cells, own))
    return out


# What a user chooses between: does calibration beat plain rounding, and which calibrated
# method loses less. Each pair is (a, b), tested as a - b.
METHOD_PAIRS = (("awq", "rtn"), ("gptq", "rtn"), ("awq", "gptq"))


def method_pair_tests(sources: list[tuple[dict[str, dict[str, Any]], list[str]]]
                      ) -> list[dict[str, Any]]:
    """Each pair of METHOD_PAIRS on every top-level task of one model (sources as
    `combined_table`'s, each task from the first grid that ran it): {"task", "a", "b",
    "source", "test"}, the test paired over the same items (each side's per-item score the
    share of its seeds right) and Holm-adjusted over all of the model's pairs. A pair is
    left out where either method has no cells or per-item records for the task."""
    pairs = []
    for index, cells, own in _own_tasks(sources):
        methods = by_method(cells)
        if not methods:
            continue
        info = model_lm_eval(next(iter(methods.values()))[0])["info"]
        children = info.get("group_subtasks") or {}
        for task, depth in task_rows(own, info):
            if depth:
                continue
            graded = {m: _method_scores(recs, task, children) for m, recs in methods.items()}
            for a, b in METHOD_PAIRS:
                side_a, side_b = graded.get(a), graded.get(b)
                if side_a is None or side_b is None or side_a[0] != side_b[0]:
                    continue
                pairs.append({"task": task, "a": a, "b": b, "source": index,
                              "test": paired_mean_test(side_a[1], side_b[1])})
    adjusted = with_holm([pair["test"] for pair in pairs])
    return [{**pair, "test": test} for pair, test in zip(pairs, adjusted, strict=True)]


def pair_findings(pairs: list[dict[str, Any]]) -> list[str]:
    """One bullet per method pair: on how many tasks each side is significantly more
    accurate after Holm, and on which."""
    out = []
    for a, b in METHOD_PAIRS:
        mine = [p for p in pairs if (p["a"], p["b"]) == (a, b)]
        if not mine:
            continue
        wins = {side: [p for p in mine if p["test"]["significant_holm"]
                       and (p["test"]["delta"] > 0) == (side == a)] for side in (a, b)}
        said = "; ".join(f"{side} on {len(won)} ("
                         + ", ".join(f"{p['task']} {p['test']['delta']:+.3f}" for p in won) + ")"
                         for side, won in wins.items() if won)
        out.append(f"- **{a} vs {b}** over {len(mine)} tasks: mean Δacc "
                   f"{mean(p['test']['delta'] for p in mine):+.4f}; more accurate after Holm: "
                   + (said or "neither, on any task") + ".")
    return out


def cell_text(row: dict[str, Any], metric: str) -> str:
    """'0.4567 ± 0.0123' (± lm-eval's stderr), '-' when the task has no such score."""
    if metric not in row:
        return "-"
    err = row.get(f"{metric}_stderr")
    digits = 2 if metric == "perplexity" else 4
    return f"{row[metric]:.{digits}f}" + ("" if err is None else f" ± {err:.{digits}f}")


def share_text(row: dict[str, Any], key: str) -> str:
    """An answer share as '0.46', '-' without items."""
    return f"{row[key]:.2f}" if key in row else "-"


def test_text(test: dict[str, Any]) -> tuple[str, str]:
    """('+0.0123 [-0.0050, +0.0300]', '0.004 *') of a paired test: its delta with the 95%
    interval, and its p (after Holm where adjusted), * where significant."""
    if test.get("no_test"):  # too few items: the effect alone
        return f"{test['delta']:+.4f} (n={test['units']}, untested)", "-"
    p = test.get("p_holm", test["p_bootstrap"])
    mark = " *" if significant(test) else ""
    return (f"{test['delta']:+.4f} [{test['ci_low']:+.4f}, {test['ci_high']:+.4f}]",
            f"{p:.3g}{mark}")


def delta_text(row: dict[str, Any]) -> tuple[str, str]:
    """`test_text` of a row's accuracy test against float; ('-', '-') without one."""
    test = row.get("acc_test")
    return test_text(test) if test else ("-", "-")


# A model whose accuracy is this close to guessing, or that gives its own favourite answer
# this often, is not showing skill on the task: a change in its accuracy is noise or a
# change of answer bias, and the findings say so instead of calling it a gain. Chance, not
# `majority`: the majority index is no strategy a log-likelihood scorer can follow where
# choices are texts (SciQ's gold is always the last choice: majority 1.0).
NEAR_BASELINE = 0.02
ONE_ANSWER = 0.9


def _at_baseline(row: dict[str, Any]) -> bool:
    if "acc" not in row or "chance" not in row:
        return False
    return row["acc"] <= row["chance"] + NEAR_BASELINE or row["top_answer"] >= ONE_ANSWER


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """One model's benchmark findings as Markdown bullets, from `combined_table`'s rows:
    per method, its mean accuracy change over the top-level tasks it was tested on and the
    changes that survive Holm; then the tasks where a model sits at the baseline."""
    out = []
    top = [r for r in rows if r["depth"] == 0]
    for method in sorted({r["model"] for r in top if r.get("acc_test")}):
        tested = [r for r in top if r["model"] == method and r.get("acc_test")]
        deltas = [r["acc_test"]["delta"] for r in tested]
        kept = [r for r in tested if r["acc_test"].get("significant_holm")]
        change = "; ".join(f"{r['task']} {r['acc_test']['delta']:+.3f} "
                           f"(p_Holm {r['acc_test']['p_holm']:.2g})" for r in kept)
        out.append(f"- **{method}** vs float over {len(tested)} tasks: mean Δacc "
                   f"{mean(deltas):+.4f} (range {min(deltas):+.3f} to {max(deltas):+.3f}); "
                   f"{len(kept)} change(s) survive Holm" + (f": {change}." if kept else "."))
    bias: dict[str, list[str]] = {}
    for r in top:
        if _at_baseline(r):
            bias.setdefault(r["task"], []).append(r["model"])
    if bias:
        out.append(f"- At the baseline (acc no more than {NEAR_BASELINE} above a uniform guess, "
                   f"or one answer on >= {ONE_ANSWER:.0%} of items): "
                   + "; ".join(f"{t} ({', '.join(m)})" for t, m in bias.items())
                   + ". A change of accuracy there is noise or a change of answer bias, not "
                   "of skill.")
    return out
