"""lm-eval task scoring: lm-eval's HFLM vs qcal's shared-context scorer; writes
results/shared_context.{json,md}.

For each model, the study's confidence tasks (arc_easy, boolq, piqa, hellaswag,
multiemo_en, multiemo_pl) on their first --limit items are run twice in one process, in
alternating order per model: once through lm-eval's own `HFLM`, once through
`qcal.eval.shared_context.SharedContextHFLM` (the choices of an item share one context
pass). Reported: wall seconds of each and their ratio, the load average around each run,
and how far the two agree (largest per-choice log-likelihood difference, items whose
predicted answer differs, lm-eval's acc of both).

    python scripts/bench_shared_context.py [--models smollm2-135m-instruct,gemma-3-270m]
                                           [--limit 40] [--out results/shared_context]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from qcal.paths import results_dir
from qcal.studies.bench import load_average, provenance, write_results
from qcal.studies.bench_tables import render_shared_context
from qcal.studies.comparisons import agreement_of_runs

TASKS = ["arc_easy", "boolq", "piqa", "hellaswag", "multiemo_en", "multiemo_pl"]


def bench_model(name: str, limit: int, first_shared: bool) -> dict[str, Any]:
    from qcal.eval.harness import run_tasks, task_manager
    from qcal.model.loading import load_model

    model, tok, _ = load_model(name)
    tm = task_manager(names=TASKS)
    runs: dict[str, Any] = {}
    for shared in ([True, False] if first_shared else [False, True]):
        before = load_average()
        start = time.perf_counter()
        run = run_tasks(model, tok, TASKS, tm, batch_size=16, limit=limit, share_contexts=shared)
        runs["shared" if shared else "lm_eval"] = {
            "seconds": round(time.perf_counter() - start, 1), "load_before": before,
            "load_after": load_average(), "run": run}
    plain, shared_run = runs["lm_eval"]["run"], runs["shared"]["run"]
    per_task = {task: agreement_of_runs(plain, shared_run, task) for task in TASKS}
    return {"model": name, "limit": limit,
            "order": "shared first" if first_shared else "lm-eval first",
            **{k: {kk: vv for kk, vv in v.items() if kk != "run"} for k, v in runs.items()},
            "speedup": round(runs["lm_eval"]["seconds"] / runs["shared"]["seconds"], 2),
            "tasks": per_task}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--out", type=Path, default=results_dir() / "shared_context")
    args = ap.parse_args()
    command = "python scripts/bench_shared_context.py " + " ".join(sys.argv[1:])
    results = [bench_model(name, args.limit, first_shared=i % 2 == 1)
               for i, name in enumerate(m for m in args.models.split(",") if m)]
    data = {"provenance": provenance(command), "results": results}
    write_results(args.out, data, render_shared_context(data))
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
