"""Whole-grid validation before any cell runs: a rejected grid leaves nothing behind.

`qcal compare` would otherwise find a typo in its fifth selector after an hour of
work; here every selector, method, scheme (against the model's real shapes), task,
language and source is checked first, without loading weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qcal.config import QuantScheme
from qcal.errors import ConfigError

if TYPE_CHECKING:
    from qcal.grid.spec import GridSpec


def validate_grid(spec: GridSpec, trust_remote_code: bool = False) -> None:
    """Raise a one-line QcalError for the first thing in `spec` that cannot run."""
    from qcal.model.loading import resolve_model_dir

    _check_selectors(spec)
    for model in spec.values("model"):
        model_dir = resolve_model_dir(model, trust_remote_code)
        for bits in spec.values("bits"):
            for group in spec.values("group_size"):
                if group == "auto":
                    continue  # resolved per model to a size that divides
                scheme = QuantScheme(bits, group, allow_ragged=spec.allow_ragged_groups)
                _check_scheme(scheme, model_dir, trust_remote_code)
    _check_eval(spec)


def _check_selectors(spec: GridSpec) -> None:
    from qcal.calib.build import parse_selector, source_languages
    from qcal.calib.io import find_calib_set
    from qcal.data import PACKAGED_SOURCES, available_languages

    source = spec.source
    packaged = source in PACKAGED_SOURCES
    if not (packaged or source.startswith("hf:") or Path(source).expanduser().is_file()
            or find_calib_set(source) is not None):
        import difflib

        close = difflib.get_close_matches(source, PACKAGED_SOURCES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"calibration source {source!r} is unknown: {hint}use one of "
                          f"{', '.join(PACKAGED_SOURCES)}, a saved set, a .txt/.jsonl file or hf:<name>")
    have = set(available_languages(source)) if packaged else None
    for text in spec.selectors:
        selector = parse_selector(text)  # unknown names list the known ones
        langs = source_languages(source, selector)
        if have is not None and langs:
            missing = sorted(set(langs) - have)
            if missing:
                raise ConfigError(f"selector {text!r} needs language(s) {missing}, which "
                                  f"{source} does not have; it has {sorted(have)}")


def _check_scheme(scheme: QuantScheme, model_dir: Path, trust_remote_code: bool) -> None:
    from qcal.model.shapes import quantized_in_features

    for n in quantized_in_features(str(model_dir.resolve()), trust_remote_code):
        scheme.groups_for(n, f"a quantized linear of {model_dir.name} (in_features={n})")


def _check_eval(spec: GridSpec) -> None:
    from qcal.data import available_languages

    cfg = spec.eval_config()  # EvalConfig checks task names and its own fields
    if spec.eval_text_file is None:
        have = set(available_languages(cfg.source))
        missing = sorted(set(spec.eval_langs) - have)
        if missing:
            raise ConfigError(f"evaluation language(s) {missing} are not in {cfg.source}; it has "
                              f"{sorted(have)}")
    elif not Path(spec.eval_text_file).expanduser().is_file():
        raise ConfigError(f"eval_text_file {spec.eval_text_file} does not exist")
    if spec.tasks:
        from qcal.eval.harness import resolve_tasks, task_manager

        resolve_tasks(spec.tasks, task_manager((), spec.tasks))
