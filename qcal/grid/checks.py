"""Whole-grid validation before any cell runs: a rejected grid leaves nothing behind.

`qcal compare` would otherwise find a typo in its fifth selector after an hour of
work; here every selector, method, scheme (against the model's real shapes), task,
language and source is checked first, without loading weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from qcal.config import QuantScheme
from qcal.errors import ConfigError

if TYPE_CHECKING:
    from qcal.grid.spec import GridSpec


def validate_grid(spec: GridSpec, trust_remote_code: bool = False,
                  check_tasks: bool = True) -> None:
    """Raise a one-line QcalError for the first thing in `spec` that cannot run.
    `check_tasks=False` skips the evaluation tasks' check (a finished grid needs no data
    to re-render, so one whose task data is gone from this machine must still be accepted)."""
    from qcal.model.loading import resolve_model_dir

    _check_selectors(spec)
    from qcal.model.shapes import skeleton

    for model in spec.values("model"):
        model_dir = resolve_model_dir(model, trust_remote_code)
        shapes = skeleton(model_dir, trust_remote_code)  # built once per model
        for bits in spec.values("bits"):
            for group in spec.values("group_size"):
                if group == "auto":
                    continue  # resolved per model to a size that divides
                scheme = QuantScheme(bits, group, allow_ragged=spec.allow_ragged_groups)
                _check_scheme(scheme, shapes)
    _check_eval(spec, check_tasks)


def _check_selectors(spec: GridSpec) -> None:
    from qcal.calib.build import parse_selector, source_languages
    from qcal.calib.io import find_calib_set
    from qcal.data import PACKAGED_SOURCES, available_languages

    source = spec.source
    packaged = source in PACKAGED_SOURCES
    if not (packaged or source.startswith("hf:") or Path(source).expanduser().is_file()
            or find_calib_set(source) is not None):
        from qcal.data.sources import unknown_source

        raise unknown_source(source)
    have = set(available_languages(source)) if packaged else None
    for text in spec.selectors:
        selector = parse_selector(text)  # unknown names list the known ones
        langs = source_languages(source, selector)
        if have is not None and langs:
            missing = sorted(set(langs) - have)
            if missing:
                raise ConfigError(f"selector {text!r} needs language(s) {missing}, which "
                                  f"{source} does not have; it has {sorted(have)}")


def _check_scheme(scheme: QuantScheme, skeleton: nn.Module) -> None:
    from qcal.schemes import validate_scheme

    validate_scheme(skeleton, scheme)  # the same check `qcal quantize` makes, on shapes only


def _check_eval(spec: GridSpec, check_tasks: bool = True) -> None:
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
    if check_tasks:
        check_grid_tasks(spec)


def check_grid_tasks(spec: GridSpec) -> None:
    """The grid's evaluation tasks must be provisioned here (one line naming the fix)."""
    if spec.tasks:
        from qcal.eval.harness import resolve_tasks, task_manager

        resolve_tasks(spec.tasks, task_manager((), spec.tasks))
