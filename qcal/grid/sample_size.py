"""Sample-size curves of a grid whose `nsamples` axis varies: per method (and selector),
perplexity against calibration tokens with a t-interval over the seeds, and a one-line
reading: the smallest size whose mean lies within the interval of the largest ("no exact
science, start with 512", GPTQModel issue 1483: this says where the noise floor starts)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from qcal.eval.stats import mean_ci


def curves(cells: dict[str, dict[str, Any]], table: dict[str, dict[str, float]], lang: str,
           seqlen: int) -> dict[str, list[dict[str, Any]]]:
    """{"method / selector": [{nsamples, tokens, mean, low, high, n}, ...] by size}."""
    groups: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, rec in cells.items():
        size = (rec.get("axes") or {}).get("nsamples")
        if rec.get("method") is None or size is None or lang not in table.get(key, {}):
            continue
        groups[f"{rec['method']} / {rec.get('selector') or 'none'}"][int(size)].append(
            table[key][lang])
    out = {}
    for name, sizes in sorted(groups.items()):
        out[name] = [{"nsamples": n, "tokens": n * seqlen, **mean_ci(v)}
                     for n, v in sorted(sizes.items())]
    return out


def reading(points: list[dict[str, Any]]) -> str:
    """The smallest size within the noise of the largest, in words."""
    largest = points[-1]
    if largest["low"] is None:
        return f"one seed per size: no interval to read (largest {largest['nsamples']})"
    for p in points[:-1]:
        if largest["low"] <= p["mean"] <= largest["high"]:
            return (f"{p['nsamples']} windows ({p['tokens']:,} tokens) are within the 95% "
                    f"interval of {largest['nsamples']} ({largest['low']:.2f}-"
                    f"{largest['high']:.2f})")
    return f"no smaller size reaches the interval of {largest['nsamples']}"


def plot(all_curves: dict[str, list[dict[str, Any]]], lang: str, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, points in all_curves.items():
        x = [p["tokens"] for p in points]
        y = [p["mean"] for p in points]
        err = [p["half_width"] or 0.0 for p in points]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("calibration tokens")
    ax.set_ylabel(f"perplexity ({lang})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out.name
