"""The tiny grid the comparison-grid tests share (test_compare_grid.py, test_grid_spec.py)."""

from __future__ import annotations

from pathlib import Path

from qcal.grid import GridSpec
from qcal.model.tiny import stdlib_text


def write_grid_texts(root: Path) -> tuple[Path, Path]:
    """Disjoint calibration and evaluation text files under `root`."""
    docs = stdlib_text()
    calib, evaluation = root / "calib.txt", root / "eval.txt"
    calib.write_text("\n\n".join(docs[:120]))
    evaluation.write_text("\n\n".join(docs[120:160]))
    return calib, evaluation


def spec_for(model: Path, texts: tuple[Path, Path], **kw) -> GridSpec:
    """A 4-cell grid (float, RTN, GPTQ x random/zipf) on `model`; `kw` overrides fields."""
    base = dict(name="tiny", model=str(model), selectors=("random", "zipf"),
                methods=("rtn", "gptq"), group_size=32, source=str(texts[0]), nsamples=4,
                seqlen=32, eval_seqlen=32, max_windows=2, eval_text_file=str(texts[1]))
    base.update(kw)
    return GridSpec(**base)
