"""Results of `qcal eval` on disk: JSON + Markdown tables, reliability PNG, items, token NLL."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from qcal.eval.job import ROLES, EvalOutcome, probs_of
from qcal.results import atomic_write_text, markdown_table, provenance, provenance_markdown

CONF_COLS = ("acc", "conf", "conf_true", "conf_correct", "conf_incorrect", "entropy", "ece",
             "adaptive_ece", "mce", "brier", "nll")


def _f(v: Any, fmt: str = ".4f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt) if isinstance(v, float) else str(v)


def _label(desc: dict[str, Any] | None) -> str:
    if not desc:
        return "-"
    if not desc.get("quantized"):
        return f"{desc['name']} (float)"
    g = "per-channel" if desc.get("group_size") == -1 else f"g{desc.get('group_size')}"
    return f"{desc['name']} ({desc.get('method')} w{desc.get('bits')} {g})"


def _models_md(data: dict[str, Any]) -> str:
    rows = []
    for role in ROLES:
        d = data.get(role)
        if d:
            rows.append([role, _label(d), f"`{d['path']}`",
                         d.get("calibration_set", "n/a (float model)")])
    return markdown_table(["role", "model", "checkpoint", "calibration set"], rows)


def _ppl_md(ppl: dict[str, Any]) -> str:
    langs = list(ppl["model"])
    if ppl.get("base"):
        rows = []
        for lang in langs:
            m, b, d = ppl["model"][lang], ppl["base"][lang], ppl["divergence"][lang]
            rows.append([lang, _f(b["ppl"], ".3f"), _f(m["ppl"], ".3f"), _f(d["ppl_delta"], "+.3f"),
                         _f(d["kl_mean"]), _f(d.get("kl_reverse_mean")), _f(d["kl_p95"]),
                         _f(d["js_mean"]), _f(d.get("top1_agreement"), ".4f"),
                         _f(d.get("localization", {}).get("worst_1pct_share"), ".3f"),
                         _f(d["tokens_nll_worse"], ".3f"), m["tokens"]])
        table = markdown_table(["lang", "base ppl", "model ppl", "delta", "KL(float||q)",
                                "KL(q||float)", "KL p95", "JS mean", "top-1 agreement",
                                "KL share of worst 1% positions", "tokens worse", "tokens"],
                               rows)
        return table + _localization_md(ppl["divergence"])
    rows = [[lang, _f(r["ppl"], ".3f"), _f(r["nll"]), r["tokens"], r["windows"]]
            for lang, r in ppl["model"].items()]
    return markdown_table(["lang", "ppl", "nll/token", "tokens", "windows"], rows)


def _localization_md(divergence: dict[str, Any]) -> str:
    """The target tokens that carry most of each language's KL (nats per token; KL share of
    the language's total), and the share per decile of the position within a window."""
    rows, deciles = [], []
    for lang, d in divergence.items():
        loc = d.get("localization")
        if not loc:
            continue
        rows += [[lang, repr(t.get("token", t["token_id"])), t["count"],
                  _f(t["kl_sum"] / max(1, t["count"]), ".3f"), _f(t["kl_share"], ".3f")]
                 for t in loc["top_tokens"][:5]]
        deciles.append([lang, *(_f(v, ".2f") for v in loc["kl_share_by_position_decile"])])
    if not rows:
        return ""
    return ("\n\nWhere the divergence sits: the predicted tokens with the largest summed "
            "KL(float||q), and each tenth of the window's positions' share of it:\n\n"
            + markdown_table(["lang", "token", "count", "mean KL", "KL share"], rows)
            + "\n\n" + markdown_table(["lang", *(f"pos {i}0%" for i in range(10))], deciles))


def _lm_md(lm: dict[str, Any]) -> str:
    res = lm["results"]
    roles = [r for r in ROLES if r in res]
    headers = ["task"] + [f"{r} {m}" for r in roles for m in ("acc", "acc_norm")]
    rows = []
    for task in res["model"]:
        row = [task]
        for r in roles:
            t = res[r].get(task, {})
            for m in ("acc", "acc_norm"):
                v, se = t.get(f"{m},none"), t.get(f"{m}_stderr,none")
                row.append(f"{_f(v)} ± {_f(se)}" if isinstance(se, float) else _f(v))
        rows.append(row)
    return markdown_table(headers, rows)


def _calib_md(calib: dict[str, Any], kind: str) -> str:
    rows = []
    for task, per in calib.items():
        for role in ROLES:
            if role in per:
                m = per[role][kind]
                rows.append([task, role, m["n"]] + [_f(m[c]) for c in CONF_COLS])
    return markdown_table(["task", "role", "n", *CONF_COLS], rows)


def _drift_md(drift: dict[str, Any], kind: str) -> str:
    rows, qrows = [], []
    for task, kinds in drift.items():
        d = kinds[kind]
        md, t = d["metric_deltas"], d["ttest_conf_true"]
        rows.append([task, d["n"], _f(md["acc"], "+.4f"), _f(md["conf_true"], "+.4f"),
                     _f(t.get("t"), ".2f"), _f(t.get("p"), ".3g"), _f(d["frac_decreased"], ".3f"),
                     _f(d["flip_rate"], ".3f"), f"{d['flips_to_wrong']}/{d['flips_to_correct']}",
                     _f(d.get("mcnemar_p"), ".3g"),
                     _f(md["ece"], "+.4f"), _f(md["brier"], "+.4f"), _f(md["nll"], "+.4f"),
                     _f(md["entropy"], "+.4f")])
        for q in d["by_base_conf_quantile"]:
            lo, hi = q["base_conf_true_range"]
            qrows.append([task, f"Q{q['quantile']}", f"{lo:.3f}-{hi:.3f}", q["n"],
                          _f(q["base_conf_true"]), _f(q["delta_conf_true"], "+.4f"),
                          _f(q.get("delta_log_odds_true"), "+.3f"),
                          _f(q["mean_abs_delta"]), _f(q["share_of_loss"], ".3f"),
                          _f(q["flip_rate"], ".3f")])
    table = markdown_table(
        ["task", "n", "d acc", "d conf_true", "t", "p", "items conf_true down", "flip rate",
         "flips to wrong/right", "McNemar p", "d ECE", "d Brier", "d NLL", "d entropy"], rows)
    quart = markdown_table(
        ["task", "base-confidence quartile", "base conf_true range", "n", "base conf_true",
         "d conf_true", "d log-odds", "mean |d|", "share of loss", "flip rate"], qrows)
    return table + "\n\nWhere the change concentrates (items split by the base model's "\
        "gold-answer probability, Q1 = least sure; d log-odds: change of log p / (1 - p) of "\
        "the gold answer, which has no floor near 0 or ceiling near 1 to pull Q1 up and Q4 "\
        "down):\n\n" + quart


def render_markdown(data: dict[str, Any], files: dict[str, str]) -> str:
    title = _label(data["model"]) + (f" vs {_label(data['base'])}" if data.get("base") else "")
    s = data["settings"]
    out = [f"# qcal eval: {title}", "", provenance_markdown(data["provenance"]), "",
           "## Models", "", _models_md(data), ""]
    if "perplexity" in data:
        stride = f"stride {s['stride']}" if s.get("stride") else "non-overlapping windows"
        out += ["## Perplexity", "",
                f"{data.get('data')}; {stride} of {s['seqlen']} tokens (tail dropped)"
                + (f", at most {s['max_windows']} windows per language" if s.get("max_windows")
                   else "") + ". KL/JS: per-token divergence of the model's next-token "
                "distribution from the base's, KL(base || model), in nats; 'tokens worse' is "
                "the share of tokens whose NLL rose.", "", _ppl_md(data["perplexity"]), ""]
    if "lm_eval" in data:
        lim = f", first {s['limit']} items per task" if s.get("limit") else ""
        out += ["## lm-eval", "", f"lm_eval {data['lm_eval']['info'].get('lm_eval_version')}, "
                f"{s.get('num_fewshot') or 0}-shot{lim}; acc = argmax log-likelihood, acc_norm "
                "= argmax log-likelihood per character (± = stderr).", "",
                _lm_md(data["lm_eval"]), ""]
    if "calibration" in data:
        bins = s["ece_bins"]
        out += ["## Confidence calibration", "",
                "p = softmax over the per-choice log-likelihoods (raw); conf = mean max p, "
                "conf_true = mean p(gold); entropy in bits; ECE with "
                f"{bins} equal-width bins, adaptive ECE with {bins} equal-count ranges, MCE = "
                "worst bin; Brier = mean sum_k (p_k - onehot_k)^2; NLL = mean -ln p(gold).",
                "", _calib_md(data["calibration"], "raw"), "",
                "Same with length-normalised p (softmax of log-likelihood per character, the "
                "acc_norm convention):", "", _calib_md(data["calibration"], "norm"), ""]
    if "drift" in data:
        out += ["## Drift from the base model", "",
                "d = model - base per item; t/p: paired t-test on conf_true; flip rate: share "
                "of items whose predicted answer changed; share of loss: the quartile's part of "
                "all gold-answer probability lost.", "", "Raw p:", "",
                _drift_md(data["drift"], "raw"), "", "Length-normalised p:", "",
                _drift_md(data["drift"], "norm"), ""]
    if files:
        out += ["## Files", ""] + [f"- {k}: `{v}`" for k, v in files.items()]
    return "\n".join(out)


def _items_jsonl(outcome: EvalOutcome) -> str:
    lines = []
    for task, recs in outcome.items.get("model", {}).items():
        base = outcome.items.get("base", {}).get(task)
        p_m = probs_of(recs, False)[0]
        p_b = probs_of(base, False)[0] if base else None
        for k, r in enumerate(recs):
            row: dict[str, Any] = {"task": task, "doc_id": r.doc_id, "gold": r.gold,
                                   "lengths": r.lengths, "model_lls": r.lls,
                                   "model_p": [round(float(x), 6) for x in p_m[k]]}
            if base:
                row["base_lls"] = base[k].lls
                row["base_p"] = [round(float(x), 6) for x in p_b[k]]
                row["delta_conf_true"] = float(p_m[k][r.gold] - p_b[k][r.gold])
            lines.append(json.dumps(row))
    return "\n".join(lines) + ("\n" if lines else "")


def write_outputs(stem: Path | str, outcome: EvalOutcome, command: str | None = None,
                  token_nll: bool = True) -> dict[str, str]:
    """Write `<stem>.json/.md`, `<stem>_reliability.png`, `<stem>_items.jsonl` and
    `<stem>_token_nll.safetensors` (whichever apply); returns {what: path}."""
    from qcal.eval.perplexity import save_token_nll
    from qcal.results import write_results

    stem = Path(stem)
    if stem.suffix in (".json", ".md"):
        stem = stem.with_suffix("")
    data = outcome.data
    files: dict[str, str] = {}
    if "calibration" in data:
        files["reliability diagram"] = str(_reliability(stem, data, outcome))
    if outcome.items.get("model"):
        p = stem.with_name(stem.name + "_items.jsonl")
        atomic_write_text(p, _items_jsonl(outcome))
        files["per-item probabilities"] = str(p)
    if token_nll and outcome.token_nll:
        p = stem.with_name(stem.name + "_token_nll.safetensors")
        save_token_nll(p, outcome.token_nll, {"model": data["model"]["path"]})
        files["token NLL (and KL/JS) streams"] = str(p)
    base = data.get("base") or {}
    data["provenance"] = provenance(
        command, model=data["model"]["path"], checkpoint=_label(data["model"]),
        base=base.get("path"), calibration_set=data["model"].get("calibration_set", "n/a (float)"),
        data=data.get("data"))
    data["files"] = files
    json_path, md_path = write_results(stem, data, render_markdown(data, files))
    return {"json": str(json_path), "markdown": str(md_path), **files}


def _reliability(stem: Path, data: dict[str, Any], outcome: EvalOutcome) -> Path:
    from qcal.eval.confidence import equal_width_bins
    from qcal.eval.plots import Panel, reliability_diagram

    bins = data["settings"]["ece_bins"]
    rows = []
    for task, per in data["calibration"].items():
        for kind, norm in (("raw", False), ("norm", True)):
            row = []
            for role in ("base", "model"):  # float first, quantized beside it
                if role not in per:
                    continue
                m = per[role][kind]
                probs, gold = probs_of(outcome.items[role][task], norm)
                correct = (probs.argmax(1) == gold).astype(float)
                what = "raw p" if kind == "raw" else "length-normalised p"
                row.append(Panel(f"{task}, {what}\n{_short(data[role])}",
                                 equal_width_bins(probs.max(1), correct, bins),
                                 m["ece"], m["acc"], m["n"]))
            rows.append(row)
    calib = data["model"].get("calibration_set", "float model")
    base = f" vs {data['base']['name']}" if data.get("base") else ""
    return reliability_diagram(
        rows, stem.with_name(stem.name + "_reliability.png"),
        suptitle=f"Reliability ({bins} bins): {_label(data['model'])}{base}",
        footer=f"checkpoint {data['model']['path']}; calibration set: {calib}")


def _short(desc: dict[str, Any]) -> str:
    label = _label(desc)
    return label[len(desc["name"]):].strip(" ()") or desc["name"]
