"""Calibration-data selection: candidate windows, selectors, saved sets with manifests.

Public entry points: `resolve_calib` (what quantizers call), `build_calib`,
`CalibSet`, `SELECTORS`, `parse_selector`. Importing this package registers the
selectors random, multilingual, zipf and perplexity.
"""

from qcal.calib import multilingual, perplexity, random_sel, zipf  # noqa: F401  (registration)
from qcal.calib.base import SELECTORS, CalibrationSelector, Selection
from qcal.calib.build import build_calib, parse_selector, resolve_calib
from qcal.calib.io import CalibSet, calib_sets_dir, list_calib_sets
from qcal.calib.manifest import CalibSetError, NotEnoughDataError
from qcal.calib.windows import WindowPool, build_windows

__all__ = [
    "SELECTORS", "CalibSet", "CalibSetError", "CalibrationSelector", "NotEnoughDataError",
    "Selection", "WindowPool", "build_calib", "build_windows", "calib_sets_dir", "list_calib_sets",
    "parse_selector", "resolve_calib",
]
