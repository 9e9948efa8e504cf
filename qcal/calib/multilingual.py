"""`multilingual`: single-language sets and mixes with exact per-language quotas.

Windows carry their documents' language (corpus tags; language-ID for untagged text,
see `qcal.calib.windows`). Given languages and weights, the quota of each language
is its share of n by the largest-remainder method, so quotas are integers summing
to exactly n (ties in the remainder go to the language listed first). Inside each
language an inner selector (``random`` by default, or ``zipf``) picks its quota;
a language with fewer windows than its quota is an error, never silently topped up
from another language.

Selector strings: ``ml:de`` (German only), ``mix:uniform`` (equal shares of every
language in the pool, or of ``--langs``), ``mix:en=0.5,de=0.25,ja=0.25`` (explicit),
and the named mixes below.

The multilingual calibration study (Chimoto et al.) used 5 single-language and 3
mixed settings but did not publish its language list; ours (`STUDY_SETTINGS`) uses
the ten languages provisioned from the Debian handbook: five single-language sets
spanning four scripts (en, de, ru, zh, ar) and three mixes: ``study10`` (equal
shares of all ten), ``en-heavy`` (English 1/2, the other nine share 1/2) and
``study5`` (equal shares of the five single languages).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from qcal.calib.base import SELECTORS, Selection
from qcal.calib.manifest import NotEnoughDataError
from qcal.calib.windows import UNKNOWN_LANG, WindowPool
from qcal.errors import ConfigError

STUDY_LANGS = ("en", "de", "fr", "es", "it", "pt", "ru", "ja", "zh", "ar")
STUDY_SINGLE = ("en", "de", "ru", "zh", "ar")
NAMED_MIXES: dict[str, dict[str, float]] = {
    "study10": {lang: 1.0 for lang in STUDY_LANGS},
    "en-heavy": {"en": 0.5, **{lang: 0.5 / 9 for lang in STUDY_LANGS if lang != "en"}},
    "study5": {lang: 1.0 for lang in STUDY_SINGLE},
}
STUDY_SETTINGS: dict[str, str] = {
    **{f"single-{lang}": f"ml:{lang}" for lang in STUDY_SINGLE},
    **{f"mix-{name}": f"mix:{name}" for name in NAMED_MIXES},
}


def quota_counts(langs: Sequence[str], weights: Sequence[float], n: int) -> dict[str, int]:
    """Integer quotas proportional to `weights`, summing to exactly n (largest remainder)."""
    if len(langs) != len(weights):
        raise ConfigError(f"{len(langs)} languages but {len(weights)} weights; give one weight each")
    if len(set(langs)) != len(langs):
        raise ConfigError(f"languages {list(langs)} repeat one; list each once")
    if not langs:
        raise ConfigError("no languages to draw from; pass --langs or a corpus with language tags")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"weights {list(weights)} must be non-negative with a positive sum")
    total = float(sum(weights))
    raw = [w / total * n for w in weights]
    counts = [int(math.floor(r)) for r in raw]
    order = sorted(range(len(langs)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return dict(zip(langs, counts, strict=True))


def parse_mix(spec: str) -> tuple[tuple[str, ...] | None, tuple[float, ...] | None]:
    """``uniform`` -> (None, None); a named mix or ``en=0.5,de=0.5`` -> (langs, weights)."""
    spec = spec.strip()
    if spec in ("", "uniform"):
        return None, None
    if spec in NAMED_MIXES:
        mix = NAMED_MIXES[spec]
        return tuple(mix), tuple(mix.values())
    langs, weights = [], []
    for part in spec.split(","):
        lang, sep, weight = part.partition("=")
        try:
            if not sep or not lang.strip():
                raise ValueError(part)
            weights.append(float(weight))
        except ValueError:
            raise ConfigError(
                f"cannot read mix {spec!r}; write lang=weight pairs (mix:en=0.5,de=0.25,ja=0.25), "
                f"'uniform', or one of {sorted(NAMED_MIXES)}"
            ) from None
        langs.append(lang.strip().lower())
    return tuple(langs), tuple(weights)


@dataclasses.dataclass(frozen=True)
class MultilingualSelector:
    """Exact per-language quotas; `langs=None` means every tagged language in the pool."""

    langs: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    inner: str = "random"
    name: str = "multilingual"

    def __post_init__(self) -> None:
        if self.langs is not None:
            from qcal.data.langid import normalize_lang

            # Same folding as the corpus tags (pt-BR -> pt, zh-CN -> zh), so quotas find them.
            object.__setattr__(self, "langs", tuple(normalize_lang(x) for x in self.langs))
        if self.inner == "multilingual":
            raise ConfigError("the inner selector of a multilingual set cannot be 'multilingual'")
        if self.weights is not None and (self.langs is None or len(self.weights) != len(self.langs)):
            raise ConfigError("weights need the matching --langs, one weight per language")

    def params(self) -> dict[str, Any]:
        return {"langs": list(self.langs) if self.langs else None,
                "weights": list(self.weights) if self.weights else None, "inner": self.inner}

    def quotas(self, pool: WindowPool, n: int) -> dict[str, int]:
        langs = list(self.langs) if self.langs else [x for x in pool.languages() if x != UNKNOWN_LANG]
        weights = list(self.weights) if self.weights else [1.0] * len(langs)
        return quota_counts(langs, weights, n)

    def select(self, pool: WindowPool, n: int, seed: int) -> Selection:
        pool.require(n)
        quotas = self.quotas(pool, n)
        by_lang: dict[str, list[int]] = {}
        for i, lang in enumerate(pool.langs):
            by_lang.setdefault(lang, []).append(i)
        short = {lang: (len(by_lang.get(lang, [])), q) for lang, q in quotas.items()
                 if len(by_lang.get(lang, [])) < q}
        if short:
            have = ", ".join(f"{lang}: {got} of {q}" for lang, (got, q) in short.items())
            raise NotEnoughDataError(
                f"not enough {pool.seqlen}-token windows for the language quotas ({have}; pool "
                f"languages: {pool.summary()['windows_per_language']}); ask for fewer samples "
                "(--nsamples; --n in `qcal calib build`) or a lower --seqlen, change the weights, "
                "or add text in those languages"
            )
        inner = SELECTORS.get(self.inner)()
        chosen: list[int] = []
        per_lang_info: dict[str, Any] = {}
        for lang, quota in quotas.items():
            if quota == 0:
                continue
            members = by_lang[lang]
            sub = inner.select(pool.subset(members), quota, seed)
            chosen.extend(members[i] for i in sub.indices)
            if sub.info:
                per_lang_info[lang] = sub.info
        info: dict[str, Any] = {"quotas": quotas}
        if per_lang_info:
            info["inner"] = per_lang_info
        return Selection(chosen, info)


SELECTORS.register("multilingual", MultilingualSelector)
