"""qcal.patterns: user regexes matched with a time bound, as re would match them."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_bounded_matching_agrees_with_re_on_ordinary_patterns() -> None:
    import re

    from qcal import patterns

    names = ["model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "lm_head"]
    for pattern in [r"q_proj$", r"layers\.1\d?\.", r".*down", r"^lm", r"mlp\.(gate|up)"]:
        for name in names:
            assert patterns.search(pattern, name) == bool(re.search(pattern, name))
            assert patterns.match(pattern, name) == bool(re.match(pattern, name))
            assert patterns.fullmatch(pattern, name) == bool(re.fullmatch(pattern, name))
    with pytest.raises(patterns.PatternError, match="characters long"):
        patterns.search("a" * 1001, "x")
