"""Frozen configs of what a run reads and measures: the calibration data (`CalibConfig`:
selector, source, windows, seed) and the evaluation (`EvalConfig`: perplexity, lm-eval
tasks, confidence metrics), with `task_limit_map` for per-task item limits.

They name no quantization grid and no method; those are in qcal.config, whose JSON round
trip (`to_dict`, `from_dict`) serves these too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from qcal.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CalibConfig:
    """Which calibration data: a selector over a source (packaged corpus, text/JSONL file,
    hf:<dataset>, or a saved set's directory or name), how many windows of how many tokens,
    and the seed of the draw."""

    selector: str = "random"
    source: str = "debian-handbook"
    nsamples: int = 128
    seqlen: int = 512
    seed: int = 0
    # How records of a dataset / JSONL source become text: the field to read, or `chat`:
    # render a record's `messages` with the model's chat template.
    text_field: str = dataclasses.field(default="text", metadata={"key_if_set": True})
    chat: bool = dataclasses.field(default=False, metadata={"key_if_set": True})

    def __post_init__(self) -> None:
        if self.nsamples < 1:
            raise ConfigError(f"--nsamples {self.nsamples} must be at least 1; GPTQ used 128")
        if self.seqlen < 2:
            raise ConfigError(f"--seqlen {self.seqlen} must be at least 2; the default is 512")
        if self.seed < 0:  # the CLI's schema says so first; this guards the Python API
            raise ConfigError(f"--seed {self.seed} must be >= 0; e.g. --seed 0")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What `qcal eval` measures.

    Perplexity on held-out text per language (fixed windows of `seqlen`, or strided);
    lm-eval `tasks` (local or standard names, first `limit` items each); with
    `confidence`, confidence-calibration metrics (ECE, Brier, ...) with `ece_bins`
    equal-width bins (15 equal-count ranges for adaptive ECE use the same count).
    """

    seqlen: int = 512
    stride: int | None = None
    batch_size: int = 4
    max_windows: int | None = None
    langs: tuple[str, ...] = ()
    ppl: bool = True
    source: str = "debian-handbook"
    tasks: tuple[str, ...] = ()
    limit: int | None = None
    # Per-task overrides of `limit`, (task, n) pairs; a group's applies to each of its
    # subtasks, as lm-eval's --limit does (mmlu=50: 50 items of each of its 57 subjects).
    task_limits: tuple[tuple[str, int], ...] = ()
    num_fewshot: int | None = None
    task_batch_size: int = 16
    confidence: bool = False  # confidence metrics; not the calibration *set*
    ece_bins: int = 15

    def __post_init__(self) -> None:
        if self.seqlen < 2:
            raise ConfigError(f"seqlen={self.seqlen} must be at least 2; the default is 512")
        if self.batch_size < 1 or self.task_batch_size < 1:
            raise ConfigError("batch sizes must be positive; try --batch-size 4")
        if self.max_windows is not None and self.max_windows < 1:
            raise ConfigError(f"max_windows={self.max_windows} must be >= 1 (or None: all "
                              "windows); e.g. --max-windows 16")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit {self.limit} must be a positive number of items")
        for task, n in self.task_limits:
            if task not in self.tasks:
                raise ConfigError(f"a per-task limit names {task!r}, which is not in --tasks "
                                  f"{list(self.tasks)}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(f"the limit of task {task} ({n!r}) must be a positive number "
                                  "of items")
        if self.ece_bins < 1:
            raise ConfigError(f"--ece-bins {self.ece_bins} must be at least 1; the usual is 15")
        if self.confidence and not self.tasks:
            raise ConfigError("--confidence scores multiple-choice items: add --tasks "
                              "(e.g. --tasks qcal_nextsent_en)")
        from qcal.fsio import plain_name

        for task in self.tasks:
            plain_name(task, "task name")


def task_limit_map(tasks: Sequence[str], limit: int | None,
                   task_limits: Mapping[str, int] | Iterable[tuple[str, int]] = ()
                   ) -> dict[str, int | None]:
    """Every task with the number of items it scores (None: all): its own limit from
    `task_limits`, else `limit`."""
    own = dict(task_limits)
    return {task: own.get(task, limit) for task in tasks}


@dataclasses.dataclass(frozen=True)
class Rotation:
    """`--rotate KIND[:SEED]`: a rotation folded into the float weights before quantizing
    (qcal.model.rotate); `hadamard` is the one kind, `seed` draws its signs."""

    kind: str = "hadamard"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind != "hadamard":
            raise ConfigError(f"--rotate {self.kind!r} is unknown; use hadamard or hadamard:SEED")
        if not 0 <= self.seed <= 2**32 - 1:
            raise ConfigError(f"--rotate seed {self.seed} must lie in [0, 2^32 - 1]")

    @classmethod
    def parse(cls, text: str) -> Rotation:
        """'hadamard' or 'hadamard:SEED'."""
        kind, sep, seed = str(text).partition(":")
        if sep and not seed.strip().isdigit():
            raise ConfigError(f"--rotate {str(text)[:80]!r}: the seed must be a non-negative "
                              "integer, e.g. hadamard:1")
        return cls(kind.strip(), int(seed) if sep else 0)

    def spec(self) -> str:
        return f"{self.kind}:{self.seed}"
