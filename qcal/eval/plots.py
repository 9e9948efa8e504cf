"""Reliability diagrams (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path

from qcal.eval.confidence import BinStats
from qcal.fsio import atomic_write_bytes


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    bins: list[BinStats]  # equal-width bins
    ece: float
    acc: float
    n: int


def reliability_diagram(panels: Sequence[Sequence[Panel]], out_path: Path | str,
                        suptitle: str = "", footer: str = "") -> Path:
    """One row per task, one column per model; bars = accuracy per confidence bin.

    The red band between a bar's top and the bar's mean confidence is the bin's gap;
    the dashed diagonal is perfect calibration; the grey step line (right axis) is the
    share of items per bin.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = len(panels), max(len(r) for r in panels)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.0 * rows + 0.9), squeeze=False)
    for r, row in enumerate(panels):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(row):
                ax.axis("off")
                continue
            p = row[c]
            width = p.bins[0].hi - p.bins[0].lo
            filled = [b for b in p.bins if b.count]
            centers = [(b.lo + b.hi) / 2 for b in filled]
            ax.bar(centers, [b.accuracy for b in filled], width=width * 0.95, color="#4c72b0",
                   edgecolor="black", linewidth=0.5, label="accuracy")
            for b, x in zip(filled, centers, strict=True):
                lo, hi = sorted((b.accuracy, b.confidence))
                ax.bar(x, hi - lo, bottom=lo, width=width * 0.95, color="#dd4444", alpha=0.35,
                       edgecolor="#aa0000", linewidth=0.5)
            ax.plot([0, 1], [0, 1], "k--", linewidth=1)
            share = ax.twinx()
            share.step([b.hi for b in p.bins], [b.count / max(p.n, 1) for b in p.bins],
                       where="pre", color="grey", linewidth=1)
            share.set_ylim(0, 1)
            share.set_yticks([])
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xlabel("confidence (max p)")
            ax.set_ylabel("accuracy")
            ax.set_title(f"{p.title}\nECE {p.ece:.3f}  acc {p.acc:.3f}  n={p.n}", fontsize=9)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    if footer:
        fig.text(0.01, 0.005, footer, fontsize=6, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04 if footer else 0, 1, 1))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=110, format="png")
        atomic_write_bytes(out, buffer.getvalue())
    finally:
        plt.close(fig)
    return out
