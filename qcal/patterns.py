"""Regular expressions from outside qcal (--targets, --ignore, --scheme-override, a
checkpoint's `dynamic` rules and compressed-tensors targets), matched with a time bound.

Python's `re` backtracks without limit: a pattern such as '(.*)*x' takes exponential time
on a long module name and cannot be interrupted. These are compiled with the `regex`
package (the same syntax for such patterns) and every match has a deadline, so a
pathological pattern is one line naming it instead of a hang.
"""

from __future__ import annotations

import functools
from typing import Any

import regex

MATCH_SECONDS = 1.0  # per name: real patterns match in microseconds
MAX_PATTERN_CHARS = 1000


class PatternError(ValueError):
    """A pattern that does not compile, is too long or ran out of time; callers name it."""


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> Any:
    """`pattern` compiled (cached); PatternError when it cannot be."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern is a string, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"it is {len(pattern):,} characters long (at most "
                           f"{MAX_PATTERN_CHARS:,})")
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise PatternError(f"it is not a regular expression ({err})") from None


def _bounded(method: str, pattern: str, name: str) -> bool:
    try:
        return getattr(compiled(pattern), method)(name, timeout=MATCH_SECONDS) is not None
    except TimeoutError:
        raise PatternError(f"matching it against {name!r} took over {MATCH_SECONDS:g} s "
                           "(catastrophic backtracking); simplify it") from None


def search(pattern: str, name: str) -> bool:
    """`re.search` semantics: the pattern occurs anywhere in `name`."""
    return _bounded("search", pattern, name)


def match(pattern: str, name: str) -> bool:
    """`re.match` semantics: the pattern matches at the start of `name`."""
    return _bounded("match", pattern, name)


def fullmatch(pattern: str, name: str) -> bool:
    """`re.fullmatch` semantics: the pattern matches all of `name`."""
    return _bounded("fullmatch", pattern, name)
