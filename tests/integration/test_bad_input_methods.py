"""The options of this round's methods and diagnostics (issues 48, 49) refuse bad input in
one line before anything is created: a rotation the architecture cannot take exactly, an
unknown rotation, AutoRound and GPTAQ settings out of range, AutoRound under --nproc, and
`qcal calib diagnose` options that name no layer or no window."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_cases import Cli, rtn_args

from qcal.model.tiny import build_tiny_family

pytestmark = pytest.mark.integration
PATTERN = "13. This round's methods and diagnostics refuse bad settings up front (issues 48, 49)"


def test_rotation_of_a_post_norm_model_is_refused(cli: Cli, home: Path) -> None:
    gemma = build_tiny_family("gemma3", home / "gemma")
    cli.refused("quantize", "--model", gemma, "--group-size", "32", "--rotate", "hadamard",
                "-o", home / "o", match="post-norms",
                case="--rotate hadamard on Gemma3 (post-norms: not exact)", pattern=PATTERN)
    assert not (home / "o").exists()


@pytest.mark.parametrize(("extra", "match", "case"), [
    (["--rotate", "givens"], "--rotate 'givens' is unknown", "--rotate givens (no such kind)"),
    (["--rotate", "hadamard:x"], "the seed must be a non-negative integer",
     "--rotate hadamard:x (seed not a number)"),
    (["--method", "autoround", "--iters", "-1"], "--iters", "--iters -1"),
    (["--method", "autoround", "--autoround-lr", "0"], "--autoround-lr", "--autoround-lr 0"),
    (["--method", "autoround", "--nproc", "2"], "drop --nproc",
     "--method autoround --nproc 2 (trains each block in one process)"),
    (["--method", "gptaq", "--gptaq-alpha", "1.5"], "--gptaq-alpha", "--gptaq-alpha 1.5"),
    (["--method", "gptq", "--gptaq-alpha", "0.5"], "--gptaq-alpha is a gptaq option",
     "--gptaq-alpha with --method gptq (would be ignored)"),
])
def test_method_settings_are_refused(cli: Cli, home: Path, extra: list[str], match: str,
                                     case: str) -> None:
    cli.refused(*rtn_args(home, home / "o", *extra), match=match, case=case, pattern=PATTERN)
    assert not (home / "o").exists()


@pytest.mark.parametrize(("extra", "match", "case"), [
    (["--layers", "9"], "--layers '9' is not a layer", "diagnose --layers 9 on a 2-layer model"),
    (["--target-windows", "0"], "--target-windows", "diagnose --target-windows 0"),
])
def test_diagnose_settings_are_refused(cli: Cli, home: Path, extra: list[str], match: str,
                                       case: str) -> None:
    stem = home / "report"
    cli.refused("calib", "diagnose", home / "calib.txt", "--model", home / "mymodel",
                "--nsamples", "4", "--seqlen", "32", *extra, "-o", stem, match=match, case=case,
                pattern=PATTERN)
    assert not stem.with_suffix(".json").exists() and not stem.with_suffix(".md").exists()
