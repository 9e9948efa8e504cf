"""`random`: uniform random windows from the pool, the baseline every paper compares against."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from qcal.calib.base import SELECTORS, Selection
from qcal.calib.windows import WindowPool


@dataclasses.dataclass(frozen=True)
class RandomSelector:
    """n distinct windows drawn uniformly without replacement (numpy PCG64 seeded by `seed`)."""

    name: str = "random"

    def params(self) -> dict[str, Any]:
        return {}

    def select(self, pool: WindowPool, n: int, seed: int) -> Selection:
        pool.require(n)
        rng = np.random.default_rng(seed)
        idx = rng.choice(len(pool), size=n, replace=False)
        return Selection([int(i) for i in idx])


SELECTORS.register("random", RandomSelector)
