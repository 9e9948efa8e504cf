"""Interval charts for the study reports: every point a mean with its 95% interval.

A study's plot must not look more certain than its tables, so each point carries the same
interval the table prints (a t-interval over calibration seeds, or a paired bootstrap
interval of a difference); a point without one (a single run) is drawn without a bar, not
with a zero-width one. matplotlib with the Agg backend (no display needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Point:
    """One mean at category `x`, with its 95% interval when there is one."""
    x: str
    mean: float
    low: float | None = None
    high: float | None = None


def from_mean_ci(x: str, ci: dict[str, Any]) -> Point:
    """A Point from `qcal.eval.stats.mean_ci`'s output (no interval from a single run)."""
    if ci.get("half_width") is None:
        return Point(x, ci["mean"])
    return Point(x, ci["mean"], ci["mean"] - ci["half_width"], ci["mean"] + ci["half_width"])


def from_test(x: str, test: dict[str, Any]) -> Point:
    """A Point from a paired test's delta and its bootstrap interval."""
    return Point(x, test["delta"], test["ci_low"], test["ci_high"])


def interval_chart(path: Path, panels: dict[str, dict[str, list[Point]]], ylabel: str,
                   title: str, references: dict[str, dict[str, float]] | None = None,
                   zero_line: bool = False) -> Path:
    """One panel per key of `panels` (side by side), each with one dodged series of points
    per series name; `references` draws named horizontal lines in a panel (e.g. the float
    model's perplexity), `zero_line` a line at 0 (for differences). Writes `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {name: series for name, series in panels.items() if any(series.values())}
    if not panels:
        raise ValueError("nothing to plot: every panel is empty")
    width = max(len({p.x for pts in s.values() for p in pts}) for s in panels.values())
    fig, axes = plt.subplots(1, len(panels), figsize=(2.0 + 0.9 * width * len(panels), 3.8),
                             squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        cats = list(dict.fromkeys(p.x for pts in series.values() for p in pts))
        step = 0.8 / max(1, len(series))
        for k, (label, pts) in enumerate(series.items()):
            offset = (k - (len(series) - 1) / 2) * step
            xs = [cats.index(p.x) + offset for p in pts]
            ax.plot(xs, [p.mean for p in pts], "o", label=label, ms=4)
            bars = [(x, p) for x, p in zip(xs, pts, strict=True) if p.low is not None]
            if bars:
                ax.errorbar([x for x, _ in bars], [p.mean for _, p in bars],
                            yerr=[[p.mean - p.low for _, p in bars],
                                  [p.high - p.mean for _, p in bars]],
                            fmt="none", capsize=3, lw=1, color=ax.lines[-1].get_color())
        for ref_label, value in (references or {}).get(name, {}).items():
            ax.axhline(value, ls="--", lw=0.8, color="grey")
            # x in axes fractions, y in data: the label stays inside whatever the x range is
            ax.text(0.99, value, ref_label, transform=ax.get_yaxis_transform(), fontsize=7,
                    ha="right", va="bottom", color="grey")
        if zero_line:
            ax.axhline(0.0, lw=0.8, color="black")
        ax.set_xticks(range(len(cats)), cats, rotation=30 if width > 4 else 0, ha="right"
                      if width > 4 else "center", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        if len(series) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # never a half-written chart at `path`
    fig.savefig(partial, dpi=110, format="png")
    plt.close(fig)
    partial.replace(path)
    return path
