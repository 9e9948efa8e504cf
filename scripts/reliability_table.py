#!/usr/bin/env python
"""Run the bad-input and fault suite and write results/reliability.{json,md}.

Each row is a case that tests/integration/test_bad_input_{safety,errors}.py ran and checked (exit
code, the one error line, nothing outside the output touched, payloads not run);
the line shown is what qcal printed. A case whose test failed is listed as FAILED.

    python scripts/reliability_table.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from qcal.results import markdown_table, provenance, provenance_markdown, write_results

ROOT = Path(__file__).resolve().parent.parent

SUITE = ("tests/integration/test_bad_input_safety.py",
         "tests/integration/test_bad_input_errors.py")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "reliability")
    args = parser.parse_args()
    rows, outcomes = run_suite()
    table = []
    for r in rows:
        status = outcomes.get(r["test"].split("[")[0], outcomes.get(r["test"], "?"))
        status = outcomes.get(r["test"], status)
        handled = "handled" if status == "passed" else status
        table.append([r["case"], f"`{r['command']}`", r["exit"], r["line"].replace("|", "/"), handled])
    recorded = {r["test"] for r in rows}
    for test, status in sorted(outcomes.items()):
        if test not in recorded and status != "passed":
            table.append([test, "-", "-", "-", status])
    prov = provenance("python scripts/reliability_table.py", suite=", ".join(SUITE),
                      model="tiny random Llama (qcal.model.tiny, 2 layers), built by the tests")
    handled = sum(1 for row in table if row[-1] == "handled")
    skipped = sum(1 for row in table if row[-1] == "skipped")
    failed = len(table) - handled - skipped
    data = {"provenance": prov, "cases": rows, "tests": outcomes,
            "summary": {"cases": len(table), "handled": handled, "skipped": skipped,
                        "failed": failed}}
    md = "\n\n".join([
        "# Reliability and security: bad input and faults",
        provenance_markdown(prov),
        f"{handled} cases handled, {failed} failed, {skipped} skipped here. *Handled* means the "
        "test checked all of: the exit code (2 for bad input, 130 for Ctrl-C, 0 where the run "
        "should proceed), exactly one "
        "`error:` line naming the problem and the fix, no traceback, no file outside the output "
        "touched or left behind, and for the security cases that the payload did not run.",
        "`$T` is the test's temporary folder, standing for the user's folder (`$T/x/mymodel` is "
        "the user's model, `$T/x/notes.txt` another file of theirs). Cases marked *emulated* "
        "inject the fault in-process (the suite runs as root here, which writes into read-only "
        "directories, and a real full disk cannot be made without privileges); the real "
        "`chmod 555` variant runs where the tests are not root.",
        markdown_table(["case", "command", "exit", "what qcal printed", "outcome"], table),
        "Behaviour checked without a printed line (same suite): qcal replaces its own checkpoint "
        "or calibration set (marker file `.qcal-output.json`) but nothing else without "
        "`--overwrite`; `<out>.work` is removed after success unless `--keep-work`; a killed "
        "save's hidden `.<out>.qcal-tmp-*` dir is removed by the next run while look-alike user "
        "files stay; `qcal compare` restarts a cell whose resume file is corrupt instead of "
        "staying stuck; a model dir with `auto_map` and a known architecture loads with "
        "transformers' own code and never imports the directory's Python. GPTQ's numerical "
        "errors are specific too (tests/unit/test_gptq.py): a negative Hessian diagonal is "
        "reported as such, and once damping has reached its ceiling the message stops "
        "suggesting a larger `--damp`.",
        "Reproduce: `python scripts/reliability_table.py` (runs the suite, about a minute).",
    ])
    write_results(args.out, data, md)
    print(f"wrote {args.out}.md: {handled} handled, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main()
