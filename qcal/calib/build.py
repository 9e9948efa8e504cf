"""Selector strings, building a set from documents, and `resolve_calib` (what quantizers call).

Selector strings: ``random``; ``zipf`` (``zipf:invfreq`` for the variant);
``perplexity`` / ``perplexity:high`` / ``perplexity:middle`` (``ppl:`` also works);
``ml:de`` (one language; ``ml:en,de`` = equal shares); ``mix:uniform``,
``mix:en=0.5,de=0.25,ja=0.25`` or a named mix (see `qcal.calib.multilingual`);
``multilingual`` with keyword arguments.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from qcal.calib.base import SELECTORS, CalibrationSelector, CalibSet, CalibSetError, make_calib_set
from qcal.calib.multilingual import STUDY_LANGS, MultilingualSelector, parse_mix
from qcal.calib.windows import build_windows
from qcal.errors import ConfigError

_ALIASES = {"ppl": "perplexity", "ml": "multilingual", "mix": "multilingual"}


def _construct(name: str, kwargs: dict[str, Any]) -> CalibrationSelector:
    factory = SELECTORS.get(name)
    fields = {f.name for f in dataclasses.fields(factory)} if dataclasses.is_dataclass(factory) else None
    given = {k: v for k, v in kwargs.items() if v is not None}
    if fields is not None:
        unknown = sorted(set(given) - fields)
        if unknown:
            raise ConfigError(f"selector {name!r} takes no option(s) {unknown}; "
                              f"its options: {sorted(fields - {'name'})}")
    return factory(**given)


def parse_selector(spec: str | CalibrationSelector, **options: Any) -> CalibrationSelector:
    """A selector from a string like ``zipf`` or ``mix:en=0.5,de=0.5`` plus options (None = default)."""
    if not isinstance(spec, str):
        return spec
    head, _, arg = spec.strip().partition(":")
    name = _ALIASES.get(head, head)
    if head == "ml":
        if not arg:
            raise ConfigError("write ml:<lang> (e.g. ml:de) for a single-language set")
        langs = tuple(x.strip().lower() for x in arg.split(",") if x.strip())
        return _construct(name, {**options, "langs": langs})
    if head == "mix":
        langs, weights = parse_mix(arg)
        if langs is None and options.get("langs"):
            langs = tuple(options["langs"])
        return _construct(name, {**options, "langs": langs, "weights": weights})
    if arg:
        key = {"perplexity": "mode", "zipf": "objective"}.get(name)
        if key is None:
            raise ConfigError(f"selector {name!r} takes no ':' argument (got {spec!r})")
        options = {**options, key: arg}
    return _construct(name, options)


def source_languages(spec: str, selector: CalibrationSelector,
                     langs: Sequence[str] | None = None) -> list[str] | None:
    """Which languages to load from `spec` when the user named none.

    Packaged corpora hold many languages, some thin: there, a single-pool selector
    draws from English (the usual calibration language) and a multilingual selector
    from its own languages, or from the study languages (`STUDY_LANGS`) the corpus
    has. Other sources are used whole (None).
    """
    if langs:
        return list(langs)
    own = getattr(selector, "langs", None)
    if isinstance(selector, MultilingualSelector) and own:
        return list(own)
    from qcal.data.corpus import PACKAGED_SOURCES, available_languages

    if spec not in PACKAGED_SOURCES:
        return None
    if isinstance(selector, MultilingualSelector):
        have = set(available_languages(spec))
        return [lang for lang in STUDY_LANGS if lang in have]
    return ["en"]


def build_calib(docs: Sequence[Any], tokenizer: Any, n: int, seqlen: int, seed: int,
                selector: str | CalibrationSelector = "random", source: str | None = None,
                pack: bool = True, max_windows_per_doc: int | None = None,
                source_langs: Sequence[str] | None = None, **options: Any) -> CalibSet:
    """Cut `docs` into windows, select n with `selector`, and return the set with its manifest."""
    sel = parse_selector(selector, **options)
    started = time.perf_counter()
    pool = build_windows(docs, tokenizer, seqlen, pack=pack, max_windows_per_doc=max_windows_per_doc)
    pool.require(n, f"{sel.name} calibration set")
    windowed = time.perf_counter()
    selection = sel.select(pool, n, seed)
    selected = time.perf_counter()
    calib = make_calib_set(pool, selection, sel, n, seed, source=source)
    calib.manifest["source_langs"] = list(source_langs) if source_langs else None
    # Wall time of this build (not part of the digest): the cost side of selector comparisons.
    calib.manifest["timing"] = {"windowing_seconds": round(windowed - started, 3),
                                "selection_seconds": round(selected - windowed, 3)}
    return calib


def check_compatible(calib: CalibSet, tokenizer: Any, nsamples: int, seqlen: int, where: str) -> None:
    """Refuse a saved set whose shape or tokenizer does not match the request."""
    from qcal.calib.base import tokenizer_info

    if calib.seqlen != seqlen:
        raise CalibSetError(f"calibration set {where} has seqlen {calib.seqlen}, not {seqlen}: pass "
                            f"--seqlen {calib.seqlen} or rebuild it with `qcal calib build --seqlen "
                            f"{seqlen}`")
    if calib.nsamples != nsamples:
        raise CalibSetError(f"calibration set {where} holds {calib.nsamples} samples, not {nsamples}: "
                            f"pass --nsamples {calib.nsamples} or rebuild it with --n {nsamples}")
    saved = calib.manifest.get("tokenizer", {}).get("fingerprint")
    if tokenizer is not None and saved and saved != tokenizer_info(tokenizer)["fingerprint"]:
        raise CalibSetError(f"calibration set {where} was built with another tokenizer "
                            f"({calib.manifest['tokenizer'].get('name_or_path')}); token ids do not "
                            "transfer: rebuild it with this model's tokenizer")
    if tokenizer is not None:
        from qcal.tokenization import text_prefix

        had, wants = calib.manifest.get("tokenizer", {}).get("prefix", []), text_prefix(tokenizer)
        if list(had) != wants:
            raise CalibSetError(f"calibration set {where} starts its windows with {had or 'no'} "
                                f"special tokens, this tokenizer with {wants or 'none'} (qcal "
                                "prepends the tokenizer's <bos> since this version): rebuild it "
                                "with `qcal calib build`")


def resolve_calib(spec: str, tokenizer: Any, nsamples: int, seqlen: int, seed: int,
                  selector: str = "random", model: Any = None,
                  langs: Sequence[str] | None = None, **options: Any) -> CalibSet:
    """A saved set (directory or name under calib_sets/), or a new one built from a source.

    `spec` is a saved set or anything `qcal.data.resolve_source` understands (packaged
    corpus name, text/JSONL file, ``hf:<dataset>``). `model` is the reference model of
    the perplexity selector (loaded from the tokenizer's directory if None).
    """
    from qcal.calib.io import find_calib_set, load_calib_set

    found = find_calib_set(spec)
    if found is not None:
        calib = load_calib_set(found)
        check_compatible(calib, tokenizer, nsamples, seqlen, str(found))
        return calib
    from qcal.data import resolve_source

    if model is not None and (selector.startswith("perplexity") or selector.startswith("ppl")):
        options = {**options, "model": model}
    sel = parse_selector(selector, **options)
    langs = source_languages(spec, sel, langs)
    docs = resolve_source(spec, split="calib", langs=langs)
    return build_calib(docs, tokenizer, nsamples, seqlen, seed, sel, source=spec, source_langs=langs)
