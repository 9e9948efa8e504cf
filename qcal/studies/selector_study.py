"""Pure helpers that turn a grid's perplexity table into the study's findings.

Kept apart from qcal.studies.selection_report so the comparisons (which selector is
which, who beats whom) are unit-tested rather than eyeballed.
"""

from __future__ import annotations

from statistics import mean


def cell_key(selector: str, method: str) -> str:
    """Name of a grid cell: the grid's own `Cell.key`, so the two cannot drift apart."""
    from qcal.grid.spec import Cell

    return Cell(selector, method).key


def selector_means(table: dict[str, dict[str, float]], method: str, selectors: list[str],
                   langs: list[str]) -> dict[str, float]:
    """{selector: mean perplexity over `langs`} for the finished cells of `method`."""
    out = {}
    for sel in selectors:
        row = table.get(cell_key(sel, method))
        if row and all(lang in row for lang in langs):
            out[sel] = mean(row[lang] for lang in langs)
    return out


def zipf_vs_perplexity(means: dict[str, float], tolerance: float = 0.01) -> str | None:
    """Verdict on the ZipCal claim for one method, or None while a cell is missing.

    'beats' / 'matches' (within `tolerance`, relative) / 'trails' perplexity-based selection.
    """
    if "zipf" not in means or "perplexity" not in means:
        return None
    zipf, ppl = means["zipf"], means["perplexity"]
    if abs(zipf - ppl) <= tolerance * ppl:
        return "matches"
    return "beats" if zipf < ppl else "trails"
