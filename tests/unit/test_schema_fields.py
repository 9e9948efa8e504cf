"""The schema's building blocks: strict booleans, ranges, plain names, sources, regexes and
sizes, and the one-line message (field, value, allowed range, fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qcal.errors import ConfigError
from qcal.schema.fields import (
    Count,
    Flag,
    Options,
    PlainName,
    Regex,
    Seed,
    Selector,
    Size,
    Source,
    validate,
)

pytestmark = pytest.mark.unit


class Probe(Options):
    flag: Flag = False
    seed: Seed = 0
    count: Count | None = None
    name: PlainName = "x"
    source: Source = "debian-handbook"
    selector: Selector = "random"
    regex: Regex | None = None
    size: Size | None = None


def _check(**data: object) -> Probe:
    return validate(Probe, data, lambda field: f"--{field}")  # type: ignore[return-value]


@pytest.mark.parametrize(("data", "match"), [
    ({"flag": "false"}, "--flag false is invalid"),
    ({"flag": 0}, "valid boolean"),
    ({"seed": -1}, r"allowed: an integer in \[0, 2\^32 - 1\]; e.g. --seed 0"),
    ({"count": 0}, r"allowed: >= 1; e.g. --count 1"),
    ({"name": "../x"}, "not a plain name"),
    ({"source": "../../x"}, "not a plain name"),
    ({"source": "missing.jsonl"}, "does not exist"),
    ({"selector": "ml:de,../x"}, "not a plain name"),
    ({"regex": "(("}, "not a regular expression"),
    ({"size": "lots"}, "not a size"),
    ({"seeds": 1}, "did you mean 'seed'"),
])
def test_refusals_are_one_line_with_the_fix(data: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        _check(**data)
    assert "\n" not in str(info.value)


def test_good_values_pass_and_keep_their_type(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("x")
    probe = _check(flag=True, seed="3", count="2", source=str(text), selector="mix:en=1,de=2",
                   regex="lm_head|.*gate$", size="4GiB")
    assert probe.flag is True and probe.seed == 3 and probe.count == 2
    assert _check(source="hf:wikitext:wikitext-2-raw-v1").source.startswith("hf:")


def test_python_api_configs_refuse_what_the_schema_refuses() -> None:
    from qcal.run_config import CalibConfig, EvalConfig

    with pytest.raises(ConfigError, match="--seed -1 must be >= 0"):
        CalibConfig(seed=-1)
    for bad in (-1, 0):
        with pytest.raises(ConfigError, match="must be >= 1"):
            EvalConfig(max_windows=bad)


@pytest.mark.parametrize(("kwargs", "match"), [({"sym": "false"}, "boolean, not a string"),
                                                ({"allow_ragged": 1}, "true or false"),
                                                ({"group_size": "big"}, "must be an integer"),
                                                ({"bits": "4"}, "not supported")])
def test_quant_scheme_refuses_wrong_types(kwargs: dict, match: str) -> None:
    from qcal.config import QuantScheme

    with pytest.raises(ConfigError, match=match):
        QuantScheme(**kwargs)
