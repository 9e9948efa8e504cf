"""The journeys table on a real model (qcal.studies.scale_journeys -> results/
scale_1p5b.{json,md}): what each command did, perplexity per language against the
float model, task accuracy with paired bootstrap intervals of the difference from float,
and the checkpoint's answer to a chat prompt in bare transformers.

    qcal report --study scale-1p5b [--out results/scale_1p5b]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qcal.eval.stats import paired_mean_test
from qcal.results import markdown_table, provenance_markdown

LANGS = ("en", "de", "zh")


def paired_accuracy(items: Path) -> dict[str, dict[str, Any]]:
    """Per task: mean accuracy of the checkpoint minus the float base over the same items
    (argmax of the per-choice log-likelihood is the gold choice), with a paired bootstrap."""
    rows: dict[str, tuple[list[float], list[float]]] = {}
    for line in items.read_text().splitlines():
        item = json.loads(line)
        mine, base = rows.setdefault(item["task"], ([], []))
        for lls, out in ((item["model_lls"], mine), (item["base_lls"], base)):
            out.append(float(max(range(len(lls)), key=lls.__getitem__) == item["gold"]))
    return {task: paired_mean_test(a, b) for task, (a, b) in sorted(rows.items())}


def cpu_hours(state: dict[str, Any]) -> float:
    """User plus system CPU time of every timed command in a benchmark's state, in hours."""
    return sum((r.get("user_seconds") or 0) + (r.get("system_seconds") or 0)
               for r in state.values() if isinstance(r, dict)) / 3600


def _journey_row(step: str, run: dict[str, Any]) -> list[Any]:
    ok = run.get("returncode") == 0
    if not ok:
        tail = (run.get("error_tail") or "").split("Command exited with")[0].strip()
        outcome = "failed: " + ((tail.splitlines() or [""])[-1][:200])
    elif step.startswith("rebuild/"):
        outcome = (f"the checkpoint rebuilt for a later step on a fresh checkout (quantize "
                   f"{run.get('quantize_seconds')} s); the quantize row keeps its own measurement")
    elif step.startswith("quantize/"):
        outcome = f"quantize {run.get('quantize_seconds')} s, {run.get('checkpoint_mib')} MiB"
    elif step.startswith("generate/"):
        outcome = f"{run.get('new_tokens')} tokens; {', '.join(run.get('classes', []))}"
    elif step.startswith("eval-alone/"):
        outcome = "the checkpoint alone, 2 English windows"
    elif step.startswith("lm-eval/"):
        outcome = f"lm_eval --model hf ran: acc {run.get('lm_eval_acc_5_items')} on 5 items"
    else:
        outcome = "see the tables below"
    if run.get("restored_from"):
        outcome += f" (measured earlier: {run['restored_from']})"
    rss = run.get("max_rss_mib")
    load = f"{run['load_before'][0]} / {run['load_after'][0]}" if run.get("load_before") else ""
    return [step, "ok" if ok else "FAILED", run.get("wall_seconds", ""),
            round(rss / 1024, 2) if rss else "", load, outcome]


def _ppl_rows(evals: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    base_done = False
    for step, ev in evals.items():
        if not step.startswith("ppl/"):
            continue
        ppl = ev["perplexity"]
        if not base_done:
            rows.append(["float (born Q4_K_M)", *[f"{ppl['base'][x]['ppl']:.3f}" if x in
                                                  ppl["base"] else "-" for x in LANGS], "", ""])
            base_done = True
        div = ppl.get("divergence", {})
        rows.append([f"{step.split('/')[1]} w4 g128",
                     *[f"{ppl['model'][x]['ppl']:.3f}" if x in ppl["model"] else "-"
                       for x in LANGS],
                     " / ".join(f"{div[x]['kl_mean']:.3f}" for x in LANGS if x in div),
                     " / ".join(f"{100 * (div[x]['ppl_ratio'] - 1):+.1f}%" for x in LANGS
                                if x in div)])
    return rows


def _task_rows(data: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for step, tests in (data.get("paired") or {}).items():
        ev = data["evals"].get(step, {})
        drift = ev.get("drift", {})
        for task, test in tests.items():
            d = (drift.get(task) or {}).get("raw", {})
            ci = (f"[{100 * test['ci_low']:+.1f}, {100 * test['ci_high']:+.1f}]"
                  if test.get("ci_low") is not None else "no interval")
            rows.append([step.split("/")[1], task, test["units"], f"{100 * test['mean_b']:.1f}",
                         f"{100 * test['mean_a']:.1f}", f"{100 * test['delta']:+.1f} {ci}",
                         f"{d.get('flips_to_wrong', '-')} / {d.get('flips_to_correct', '-')}",
                         f"{d['delta_conf_true']:+.4f}" if "delta_conf_true" in d else "-"])
    return rows


def render_journeys(data: dict[str, Any]) -> str:
    st = data["state"]
    md = [f"# Journeys on {data.get('model', 'the model')}", "",
          "Each row is one command a user would run, in order, on this 2-core CPU (peak RSS "
          "and wall time from GNU time; load average before / after). The float model is "
          "born Q4_K_M (blocks of 32): every number here uses group 128, where that grid "
          "does not line up with ours.", "",
          markdown_table(["step", "exit", "wall s", "peak RSS GiB", "load", "outcome"],
                         [_journey_row(k, v) for k, v in st.items() if isinstance(v, dict)]), "",
          f"CPU time of these commands (user + system): {cpu_hours(st):.2f} CPU hours.", ""]
    ppl = _ppl_rows(data.get("evals", {}))
    if ppl:
        md += ["## Perplexity (8 held-out handbook windows of 512 per language)", "",
               markdown_table(["model", *LANGS, "KL(float to quant), nats/token, en / de / zh",
                               "ppl vs float en / de / zh"], ppl), ""]
    tasks = _task_rows(data)
    if tasks:
        md += ["## Accuracy against float (same items, paired)", "",
               markdown_table(["method", "task", "items", "float acc %", "quant acc %",
                               "difference, pp [95% CI]", "flips to wrong / to correct",
                               "mean change of gold confidence"], tasks), ""]
    for step, run in st.items():
        if step.startswith("generate/") and isinstance(run, dict) and run.get("answer"):
            md += [f"## {step}: bare `AutoModelForCausalLM.from_pretrained(path)`, greedy", "",
                   f"Prompt: {run['prompt']}", "", "````", run["answer"].strip(), "````", ""]
    if data.get("peer_pages"):
        md += ["## Peers at this size", "", "qcal against GPTQModel on the same calibration ids: "
               + ", ".join(f"[{p}]({p})" for p in data["peer_pages"]) + ".", ""]
    md += ["## Provenance", "", provenance_markdown(data["provenance"]), "",
           f"Flags: {json.dumps(data.get('flags'))}"]
    return "\n".join(md)


def render_journeys_study(grids: list[Path], out: Path | None = None) -> None:
    from qcal.studies.peers_report import rerender_json

    rerender_json("scale-1p5b", grids, out, render_journeys)
