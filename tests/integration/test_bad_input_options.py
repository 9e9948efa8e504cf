"""Options that were silently ignored or could hang (issue 52): an option given twice, a
grid key given twice, a --targets/--ignore pattern that matches nothing, and a pattern
whose matching backtracks without end are each refused in one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_cases import Cli, rtn_args

pytestmark = pytest.mark.integration
PATTERN = "11. Every option counts: given once, patterns that match and finish (issue 52)"


@pytest.mark.parametrize("second", [["--group-size", "64"], ["--group-size=64"]])
def test_an_option_given_twice_is_refused(cli: Cli, home: Path, second: list[str]) -> None:
    cli.refused(*rtn_args(home, home / "o", *second), match="--group-size is given more than once",
                case=f"--group-size 32 then {' '.join(second)} (the last won silently)")
    assert not (home / "o").exists()


def test_repeatable_options_stay_repeatable(cli: Cli, home: Path) -> None:
    rc, err = cli(*rtn_args(home, home / "o", "--ignore", r"layers\.0\.", "--ignore",
                            r"layers\.1\.mlp"))
    assert rc == 0, err


def test_a_grid_key_given_twice_is_refused(cli: Cli, home: Path) -> None:
    grid = home / "grid.yaml"
    grid.write_text(f"name: dup\nmodel: {home / 'mymodel'}\nmethods: [rtn]\n"
                    "selectors: [random]\nmethods: [gptq]\n")
    cli.refused("compare", "--config", grid, match="key 'methods' is given twice (lines 3 and 5)",
                case="grid YAML with methods: twice (the second list ran alone)")
    assert not (home.parent / "results" / "dup").exists()


@pytest.mark.parametrize("flag", ["--ignore", "--targets"])
def test_a_pattern_matching_no_linear_is_refused(cli: Cli, home: Path, flag: str) -> None:
    cli.refused(*rtn_args(home, home / "o", flag, "mlp.gate_porj"),
                match=f"{flag} 'mlp.gate_porj' matches no linear",
                case=f"{flag} with a typo (matched nothing, passed unremarked)")
    assert not (home / "o").exists()


def test_a_backtracking_pattern_is_stopped(cli: Cli, home: Path) -> None:
    # Python's re takes minutes on this pattern against a 31-character module name; the
    # bounded matcher stops it within its time limit.
    cli.refused(*rtn_args(home, home / "o", "--ignore", r"(.|.)*\d\d"),
                match="catastrophic backtracking",
                case="--ignore '(.|.)*\\d\\d' (exponential backtracking)")
    assert not (home / "o").exists()


def test_a_grid_of_too_many_cells_needs_max_cells(cli: Cli, home: Path, tmp_path: Path) -> None:
    grid = home / "big.yaml"
    seeds = ", ".join(str(i) for i in range(64))
    grid.write_text(f"name: big\nmodel: {home / 'mymodel'}\nmethods: [rtn, gptq]\n"
                    f"selectors: [random, zipf, perplexity, ml:en]\nseed: [{seeds}]\n")
    line = cli.refused("compare", "--config", grid, "--results-dir", tmp_path / "res",
                       match="grid big has 258 cells (2 methods x 4 selectors x 64 seed), more "
                             "than --max-cells 200",
                       case="a 258-cell grid (a 1,000,001-cell one, ETA 1,069 h, just started)")
    assert "--max-cells 258" in line
    assert not (tmp_path / "res").exists()
    seeds = ", ".join(str(i) for i in range(1_000))
    grid.write_text(f"name: huge\nmethods: [gptq]\nseed: [{seeds}]\n")
    cli.refused("compare", "--config", grid, match="should have at most 64 items",
                case="a grid axis of 1,000 seeds")


API_CASES = [
    ({"nsamples": "12"}, "qcal.quantize(nsamples=...) '12' is invalid (input should be a valid "
                         "integer)"),
    ({"nsamples": 10**9}, "less than or equal to 1000000"),
    ({"seqlen": 2.5}, "qcal.quantize(seqlen=...) 2.5 is invalid"),
    ({"chat": "yes"}, "qcal.quantize(chat=...) 'yes' is invalid (input should be a valid "
                      "boolean)"),
    ({"output": 3}, "qcal.quantize(output=...) 3 is invalid"),
    ({"targets": 5}, "qcal.quantize(targets=...) 5 is invalid (input should be a valid list)"),
    ({"desc_act": "true"}, "qcal.quantize: desc_act 'true' is not a bool"),
    ({"seed": -1}, "qcal.quantize(seed=...) -1 is invalid"),
]


@pytest.mark.parametrize(("given", "match"), API_CASES, ids=[str(c[0]) for c in API_CASES])
def test_the_python_api_validates_through_the_schema(cli: Cli, home: Path, given: dict,
                                                     match: str) -> None:
    import qcal
    from qcal.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        qcal.quantize(str(home / "mymodel"), method="gptq", **{"output": home / "o", **given})
    assert match in str(refused.value), str(refused.value)
    assert not (home / "o").exists()
    cli.record(f"qcal.quantize({', '.join(f'{k}={v!r}' for k, v in given.items())})",
               ("python", "qcal.quantize(...)"), 2, f"ConfigError: {refused.value}")


@pytest.mark.parametrize("calib", ["calib.txt", "debian-handbook", "hf:wikitext"])
def test_chat_with_a_source_of_no_records_is_refused(cli: Cli, home: Path, calib: str) -> None:
    source = str(home / calib) if calib.endswith(".txt") else calib
    cli.refused("quantize", "--model", home / "mymodel", "--method", "gptq", "--group-size",
                "32", "--calib", source, "--chat", "-o", home / "o",
                match="--chat renders the 'messages' of chat records",
                case=f"--chat with --calib {calib} (ignored, yet recorded as chat: true)")
    assert not (home / "o").exists()


@pytest.mark.parametrize(("given", "match"), [
    ({"limit": "5"}, "qcal.evaluate(limit=...) '5' is invalid (input should be a valid integer)"),
    ({"seqlen": 10**8}, "less than or equal to 1048576"),
    ({"ece_bins": 10**9}, "less than or equal to 1000"),
])
def test_evaluate_validates_through_the_schema(cli: Cli, home: Path, given: dict,
                                               match: str) -> None:
    import qcal
    from qcal.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        qcal.evaluate(str(home / "mymodel"), **given)
    assert match in str(refused.value), str(refused.value)
    cli.record(f"qcal.evaluate({', '.join(f'{k}={v!r}' for k, v in given.items())})",
               ("python", "qcal.evaluate(...)"), 2, f"ConfigError: {refused.value}")
