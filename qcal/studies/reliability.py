"""Run the bad-input and fault suite and write results/reliability.{json,md}.

Each row is a case that tests/integration/test_bad_input_*.py ran and checked (exit code, the
one error line, nothing outside the output touched, no output/work dir left, payloads not
run); the line shown is what qcal printed. Rows are grouped by the pattern of issue 37 they
test. A case whose test failed is listed as FAILED.

    qcal report --study reliability [--out results/reliability]

It runs the suite of a source checkout (its tests/), so it works from one only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from qcal.results import markdown_table, provenance, provenance_markdown, write_results

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose tests/ hold the suite

SUITE = ("tests/integration/test_bad_input_safety.py",
         "tests/integration/test_bad_input_errors.py",
         "tests/integration/test_bad_input_schema.py",
         "tests/integration/test_bad_input_model.py",
         "tests/integration/test_bad_input_outputs.py",
         "tests/integration/test_bad_input_boundary.py",
         "tests/integration/test_bad_input_guards.py",
         "tests/integration/test_bad_input_folders.py",
         "tests/integration/test_bad_input_config.py",
         "tests/integration/test_bad_input_data.py",
         "tests/integration/test_bad_input_options.py",
         "tests/integration/test_signals.py",
         "tests/integration/test_bad_input_methods.py")
# Cases of the earlier suites carry no pattern of their own: grouped by their file.
MODULE_PATTERN = {
    "test_bad_input_safety": "0a. Never lose a user's file; names are plain; no code runs",
    "test_bad_input_errors": "0b. One clear line instead of a traceback; hygiene",
    "test_bad_input_guards": "7. Outputs guarded to the end, never inside an input; task code "
                             "only with the opt-in (issue 52)",
    "test_bad_input_folders": "8. A model folder: plain files only, one unambiguous weight set "
                              "(issue 52)",
    "test_signals": "12. Signals reach every process qcal started (issue 52)",
}


def run_suite() -> tuple[list[dict], dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        log, junit = Path(tmp) / "cases.jsonl", Path(tmp) / "junit.xml"
        env = {**os.environ, "QCAL_RELIABILITY_LOG": str(log)}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE,
                        f"--junitxml={junit}"], cwd=ROOT, env=env, check=False)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        outcomes: dict[str, str] = {}
        for case in ET.parse(junit).getroot().iter("testcase"):
            kids = {child.tag for child in case}
            outcomes[case.get("name", "?")] = ("FAILED" if kids & {"failure", "error"}
                                               else "skipped" if "skipped" in kids else "passed")
    return rows, outcomes


def _group_order(name: str) -> tuple[int, str]:
    """Groups by their number (2 before 10), then by name (0a before 0b)."""
    digits = name[:len(name) - len(name.lstrip("0123456789"))]
    return (int(digits) if digits else 10**6, name)


def pattern_of(row: dict) -> str:
    module = str(row.get("module", "")).rsplit(".", 1)[-1]
    return row.get("pattern") or MODULE_PATTERN.get(module, "other")


def render(grids: list[Path], out: Path | None = None) -> None:
    """Run the suite, then write its table to `out` (default results/reliability)."""
    from qcal.errors import ConfigError

    if grids:
        raise ConfigError("--study reliability reads no grid: drop the folders")
    missing = [name for name in SUITE if not (ROOT / name).is_file()]
    if missing:
        raise ConfigError(f"--study reliability runs the tests of a source checkout; "
                          f"{ROOT / missing[0]} is missing: run it from a git clone of qcal")
    rows, outcomes = run_suite()
    write_table(rows, outcomes, out or ROOT / "results" / "reliability")


def write_table(rows: list[dict], outcomes: dict[str, str], out: Path) -> None:
    """The table of the suite's recorded cases (`rows`) and test outcomes, to `out`."""
    groups: dict[str, list[list]] = {}
    for r in rows:
        status = outcomes.get(r["test"].split("[")[0], outcomes.get(r["test"], "?"))
        status = outcomes.get(r["test"], status)
        handled = "handled" if status == "passed" else status
        groups.setdefault(pattern_of(r), []).append(
            [r["case"], f"`{r['command']}`", r["exit"], r["line"].replace("|", "/"), handled])
    recorded = {r["test"] for r in rows}
    for test, status in sorted(outcomes.items()):
        if test not in recorded and status != "passed":
            groups.setdefault("99. Tests without a recorded line (skipped or failed)", []).append(
                [test, "-", "-", "-", status])
    table = [row for rows_ in groups.values() for row in rows_]
    prov = provenance("qcal report --study reliability", suite=", ".join(SUITE),
                      model="tiny random Llama (qcal.model.tiny, 2 layers), built by the tests")
    handled = sum(1 for row in table if row[-1] == "handled")
    skipped = sum(1 for row in table if row[-1] == "skipped")
    failed = len(table) - handled - skipped
    data = {"provenance": prov, "cases": rows, "tests": outcomes,
            "summary": {"cases": len(table), "handled": handled, "skipped": skipped,
                        "failed": failed, "per_pattern": {k: len(v) for k, v in groups.items()}}}
    sections = []
    for name in sorted(groups, key=_group_order):
        sections += [f"## {name} ({len(groups[name])} cases)",
                     markdown_table(["case", "command", "exit", "what qcal printed", "outcome"],
                                    groups[name])]
    md = "\n\n".join([
        "# Reliability and security: bad input and faults",
        provenance_markdown(prov),
        f"{handled} cases handled, {failed} failed, {skipped} skipped here. *Handled* means the "
        "test checked all of: the exit code (2 for bad input, 3 for an internal error with its "
        "logged traceback, 130 for Ctrl-C, 143 for SIGTERM, 0 where the run should proceed), "
        "exactly one `error:` line naming the problem and the fix, no traceback, no file "
        "outside the output touched or left behind (for the schema cases: no output, work or "
        "results directory at all), and for the security cases that the payload did not run.",
        "Groups 1-6 are the patterns of issue 37 (one validation layer). Group 1 and 2 cases "
        "are refused by the schema (qcal/schema) before any model is loaded; group 4 by "
        "qcal/model/consistency.py before any weight is used. Groups 7-12 are the causes of "
        "issue 52: config.json against transformers' own rules and the weight files "
        "(qcal/model/config_rules.py), every input read before the output guard "
        "(qcal/run.py), bounded chat templates (qcal/calib/chat.py) and regex matching "
        "(qcal/patterns.py), options that count once, and signals reaching child processes "
        "(qcal/processes.py). The only exit-3 rows are injected internal bugs, which is what "
        "exit 3 is kept for.",
        "`$T` is the test's temporary folder, standing for the user's folder (`$T/x/mymodel` is "
        "the user's model, `$T/x/notes.txt` another file of theirs). Cases marked *emulated* "
        "or *injected* put the fault in in-process (the suite runs as root here, which writes "
        "into read-only directories, and a real full disk cannot be made without privileges); "
        "the real `chmod 555` variant runs where the tests are not root.",
        *sections,
        "Behaviour checked without a printed line (same suite): qcal replaces its own checkpoint "
        "or calibration set (marker file `.qcal-output.json`) or its own eval results (their "
        "provenance) but nothing else without `--overwrite`; `<out>.work` is removed after "
        "success unless `--keep-work`; a killed save's hidden `.<out>.qcal-tmp-*` dir is removed "
        "by the next run while look-alike user files stay; `qcal compare` restarts a cell whose "
        "resume file is corrupt instead of staying stuck; a model dir with `auto_map` and a "
        "known architecture loads with transformers' own code and never imports the directory's "
        "Python; the schema covers every argparse option and grid key "
        "(tests/unit/test_schema_coverage.py). GPTQ's numerical errors are specific too "
        "(tests/unit/test_gptq.py).",
        "Reproduce: `qcal report --study reliability` (runs the suite, a few minutes).",
    ])
    write_results(out, data, md)
    print(f"wrote {out}.md: {handled} handled, {failed} failed, {skipped} skipped")

