"""Give grid cells recorded before qcal kept per-item LAMBADA results their items, from the
scores the grid kept, without running any model.

A cell's lm-eval run keeps every request's (log-likelihood, greedy) in its score store
(`<work>/scores/<cell>.jsonl`, qcal.eval.score_store). This script rebuilds the requests of
each single-continuation task the cell ran (lambada_openai) with lm-eval's own task and
HFLM tokenization (the grid's float model and tokenizer: a quantized checkpoint has the
same tokenizer and config), answers every request from the store (a request missing there
stops the script; nothing is scored afresh), and lets lm-eval compute its metrics again.
Only when those equal the metrics the cell recorded (acc and perplexity, to a relative 1e-9) are the
per-item records written into the cell (`eval.lm_eval.continuation_items`, atomically);
a cell that already has them is left alone.

    qcal report results/study_benchmarks [results/study_benchmarks_gemma3 ...] --study lambada-items

Each grid's work folder is runs/compare/<grid name> (under $QCAL_RUNS_DIR when set).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qcal.errors import ConfigError, QcalError
from qcal.fsio import atomic_write_text
from qcal.grid.runner import saved_spec

SINGLE_CONTINUATION_TASKS = ("lambada_openai",)


def replay_lm(model: Any, tok: Any, scores: dict[str, tuple[float, bool]]) -> Any:
    """lm-eval's HFLM whose log-likelihoods come from `scores` only."""
    from lm_eval.models.huggingface import HFLM

    from qcal.eval.score_store import request_key

    class ReplayHFLM(HFLM):
        def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False,
                                  override_bs: int | None = None) -> list[tuple[float, bool]]:
            out = []
            for _, context, continuation in requests:
                answer = scores.get(request_key(context, continuation))
                if answer is None:
                    raise QcalError("a request is not in the score store (scored with another "
                                    "tokenizer or limit?); rerun the cell instead")
                out.append(answer)
            return out

    # The model never runs (every score comes from the store); HFLM only reads its config
    # (max length, BOS) to tokenize as the grid did, so it stays on the CPU.
    return ReplayHFLM(pretrained=model, tokenizer=tok, batch_size=16, device="cpu")


def backfill(grid: Path, work: Path) -> list[str]:
    """Cells of `grid` given their continuation items; raises on any mismatch."""
    from qcal.eval.harness import run_tasks, task_manager
    from qcal.eval.score_store import parse_scores
    from qcal.model.loading import load_model

    # qcal's own loader: safetensors only, local files, no remote code.
    model, tok, _ = load_model(saved_spec(grid).get("model"))
    done = []
    for cell_file in sorted((grid / "cells").glob("*.json")):
        record = json.loads(cell_file.read_text())
        block = record["eval"]["lm_eval"]
        kept = block.get("continuation_items") or {}
        tasks = [t for t in SINGLE_CONTINUATION_TASKS
                 if t in block["results"]["model"] and t not in kept]
        if not tasks:
            continue
        store = work / "scores" / f"{record['cell']}.jsonl"
        if not store.is_file():
            raise QcalError(f"{store} is missing; cell {record['cell']} cannot be backfilled")
        # Read only: the header names the quantized checkpoint, not the model loaded here.
        lm = replay_lm(model, tok, parse_scores(store.read_text(encoding="utf-8").split("\n")[1:]))
        for task in tasks:
            limit = (block["info"].get("limits") or {}).get(task)
            run = run_tasks(lm, tok, [task], task_manager(names=[task]), limit=limit)
            want, got = block["results"]["model"][task], run.metrics[task]
            for metric in ("acc,none", "perplexity,none"):
                if abs(float(want[metric]) - float(got[metric])) > 1e-9 * max(
                        1.0, abs(float(want[metric]))):
                    raise QcalError(f"cell {record['cell']} {task}: replayed {metric} "
                                    f"{got[metric]} != recorded {want[metric]}; not written")
            kept[task] = run.continuations[task]
        block["continuation_items"] = kept
        atomic_write_text(cell_file, json.dumps(record, indent=1, default=str))
        done.append(record["cell"])
        print(f"{cell_file}: {', '.join(tasks)} items written", flush=True)
    return done


def render(grids: list[Path], out: Path | None = None) -> None:
    """Backfill every grid in `grids` from its work folder's score store."""
    from qcal.paths import runs_dir

    if not grids or out is not None:
        raise ConfigError("--study lambada-items needs the grid folders it completes "
                          "(e.g. results/study_benchmarks) and writes into their cells, not --out")
    for grid in grids:
        if not (grid / "grid.json").is_file():
            raise ConfigError(f"{grid} holds no grid; give a folder `qcal compare` wrote")
        backfill(grid, runs_dir() / "compare" / grid.name)
