"""Calibration-data selection: candidate windows, selectors, saved sets with manifests.

Public entry points: `resolve_calib` (what quantizers call), `build_calib`,
`CalibSet`, `SELECTORS`, `parse_selector`. Importing this package registers the
selectors random, multilingual, zipf and perplexity.
"""

from pathlib import Path
from typing import Any

from qcal.calib import multilingual, perplexity, random_sel, zipf  # noqa: F401  (registration)
from qcal.calib.base import SELECTORS, CalibrationSelector, Selection
from qcal.calib.build import build_calib, parse_selector, resolve_calib
from qcal.calib.io import CalibSet, calib_sets_dir, list_calib_sets
from qcal.calib.manifest import CalibSetError, NotEnoughDataError
from qcal.calib.windows import WindowPool, build_windows


def build(source: str = "debian-handbook", *, model: Any = None, tokenizer: Any = None,
          nsamples: int = 128, seqlen: int = 512, seed: int = 0, selector: str = "random",
          output: str | Path | None = None, **options: Any) -> CalibSet:
    """`qcal.calib.build(...)`: a calibration set drawn from `source` (anything --calib takes)
    with `selector`, tokenized with `tokenizer` or the tokenizer of `model` (folder, Hub id,
    None = the default model); saved with its manifest to `output` when given.

    (This function replaces the package attribute that named the submodule
    qcal.calib.build; `from qcal.calib.build import ...` still works.)"""
    from qcal.calib.io import save_calib_set
    from qcal.model.loading import load_tokenizer, resolve_model_dir

    if tokenizer is None:
        tokenizer = load_tokenizer(resolve_model_dir(model))
    calib = resolve_calib(str(source), tokenizer, nsamples=nsamples, seqlen=seqlen, seed=seed,
                          selector=selector, **options)
    if output is not None:
        save_calib_set(calib, Path(output))
    return calib

__all__ = [
    "SELECTORS", "build", "CalibSet", "CalibSetError", "CalibrationSelector", "NotEnoughDataError",
    "Selection", "WindowPool", "build_calib", "build_windows", "calib_sets_dir", "list_calib_sets",
    "parse_selector", "resolve_calib",
]
