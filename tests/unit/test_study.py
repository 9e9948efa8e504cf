"""The study's findings map each selector's own cells to its own numbers."""

import pytest

from qcal.studies.selector_study import cell_key, selector_means, zipf_vs_perplexity

pytestmark = pytest.mark.unit

SELECTORS = ["random", "zipf", "perplexity"]


def test_cell_key_matches_grid_naming():
    assert cell_key("ml:en", "gptq") == "ml-en__gptq"
    assert cell_key("zipf", "awq") == "zipf__awq"


def test_selector_means_keep_each_selector_with_its_own_cell():
    # Distinct values per selector: a mix-up of the order would be visible.
    table = {"random__gptq": {"en": 30.0, "de": 40.0},
             "zipf__gptq": {"en": 10.0, "de": 20.0},
             "perplexity__gptq": {"en": 50.0, "de": 70.0},
             "zipf__awq": {"en": 1.0, "de": 1.0}}
    means = selector_means(table, "gptq", SELECTORS, ["en", "de"])
    assert means == {"random": 35.0, "zipf": 15.0, "perplexity": 60.0}
    assert selector_means(table, "gptq", SELECTORS, ["en"]) == {
        "random": 30.0, "zipf": 10.0, "perplexity": 50.0}


def test_selector_means_skip_unfinished_or_partial_cells():
    table = {"zipf__gptq": {"en": 10.0}, "random__gptq": {"en": 12.0, "de": 3.0}}
    assert selector_means(table, "gptq", SELECTORS, ["en", "de"]) == {"random": 7.5}


@pytest.mark.parametrize(("zipf", "ppl", "verdict"), [
    (10.0, 10.05, "matches"), (10.05, 10.0, "matches"),
    (9.0, 10.0, "beats"), (11.0, 10.0, "trails")])
def test_zipf_verdict(zipf, ppl, verdict):
    assert zipf_vs_perplexity({"zipf": zipf, "perplexity": ppl, "random": 99.0}) == verdict


def test_zipf_verdict_waits_for_both_cells():
    assert zipf_vs_perplexity({"zipf": 10.0}) is None


def test_report_names_each_command_that_produced_cells():
    from qcal.grid.report import _command_lines

    one = {"float": {"provenance": {"command": "qcal compare a"}},
           "x__gptq": {"provenance": {"command": "qcal compare a"}}}
    assert _command_lines(one) == ["- Grid command: `qcal compare a`"]
    two = {**one, "y__gptq": {"provenance": {"command": "qcal compare a --desc-act"}}}
    lines = _command_lines(two)
    assert len(lines) == 2 and "float, x__gptq" in lines[0] and "y__gptq" in lines[1]


def test_scripts_find_the_qcal_command_without_an_activated_venv():
    import os
    import subprocess

    from qcal.cli import command_prefix

    prefix = command_prefix()
    assert os.access(prefix[0], os.X_OK)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"  # no venv on PATH, as in `.venv/bin/python scripts/...`
    out = subprocess.run([*prefix, "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "quantize" in out.stdout
