"""Bad input, part 4: one schema checks every option and every grid key before anything
happens. Each case exits 2 with one line naming the field, the value and the fix, loads no
model, and leaves no output, work or results directory behind (the whole temp tree is
compared before and after).

Patterns follow issue 37: 1 grid YAML types, 2 values never checked, 3 checks that came
after the work, 5 names (path traversal)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_cases import Cli

pytestmark = pytest.mark.integration

P1, P2, P3, P5 = ("1. Grid YAML validated by type and range", "2. Values that were never checked",
                  "3. Checks that came after the work", "5. Names and outputs: one rule")
Q = ("quantize", "--model", "{x}/mymodel", "--calib", "{x}/calib.txt", "-o", "{x}/o")
G = ("quantize", "--model", "{x}/mymodel", "--method", "gptq", "--calib", "{x}/calib.txt",
     "-o", "{x}/o")
E = ("eval", "--model", "{x}/mymodel", "-o", "{x}/res")
B = ("calib", "build", "--model", "{x}/mymodel", "--source", "{x}/calib.txt", "-o", "{x}/set")
C = ("compare", "--name", "g", "--model", "{x}/mymodel", "--methods", "rtn",
     "--source", "{x}/calib.txt", "--results-dir", "{t}/results")

CLI_CASES = [
    # (pattern, case, argv, what the line must contain)
    (P2, "quantize --seed -1", (*G, "--seed", "-1"), "--seed -1"),
    (P2, "calib build --seed -1", (*B, "--seed", "-1"), "--seed -1"),
    (P2, "compare --seed -1", (*C, "--seed", "-1"), "--seed -1"),
    (P2, "quantize --eval --eval-windows -1", (*Q, "--eval", "--eval-windows", "-1"),
     "greater than or equal to 1"),
    (P2, "quantize --eval --eval-windows 0", (*Q, "--eval", "--eval-windows", "0"),
     "greater than or equal to 1"),
    (P2, "eval --max-windows -1", (*E, "--max-windows", "-1"), "--max-windows -1"),
    (P2, "eval --max-windows 0", (*E, "--max-windows", "0"), "greater than or equal to 1"),
    (P2, "compare --max-windows -1", (*C, "--max-windows", "-1"), "greater than or equal to 1"),
    (P2, "compare --max-windows 0", (*C, "--max-windows", "0"), "greater than or equal to 1"),
    (P2, "quantize --nsamples 0", (*G, "--nsamples", "0"), "--nsamples 0"),
    (P2, "quantize --nsamples 2.7", (*G, "--nsamples", "2.7"), "valid integer"),
    (P2, "quantize --nsamples abc", (*G, "--nsamples", "abc"), "valid integer"),
    (P2, "quantize --seqlen 1", (*G, "--seqlen", "1"), "greater than or equal to 2"),
    (P2, "quantize --bits five", (*Q, "--bits", "five"), "--bits five"),
    (P2, "quantize --group-size big", (*Q, "--group-size", "big"), "positive integer"),
    (P2, "quantize --group-size 0", (*Q, "--group-size", "0"), "positive integer"),
    (P2, "quantize --group-size -2", (*Q, "--group-size", "-2"), "-1 (per channel)"),
    (P2, "quantize --damp 0", (*G, "--damp", "0"), "(0, 1)"),
    (P2, "quantize --damp 1.5", (*G, "--damp", "1.5"), "(0, 1)"),
    (P2, "quantize --damp lots", (*G, "--damp", "lots"), "--damp lots"),
    (P2, "quantize --method gtpq (typo)", (*Q, "--method", "gtpq"), "did you mean 'gptq'"),
    (P2, "quantize --format gguf", (*Q, "--format", "gguf"), "choose one of gptq"),
    (P2, "quantize --device tpu", (*Q, "--device", "tpu"), "cpu, cuda, cuda:N or auto"),
    (P2, "quantize --nproc 0", (*Q, "--nproc", "0"), "greater than or equal to 1"),
    (P2, "quantize --nproc 10000", (*Q, "--nproc", "10000"), "use at most"),
    (P2, "quantize --mse-norm inf", (*Q, "--method", "rtn-mse", "--mse-norm", "inf"),
     "finite number"),
    (P2, "quantize --search-tokens -1", (*Q, "--method", "awq", "--search-tokens", "-1"), ">= 0"),
    (P2, "quantize --awq-artifact <missing file>",
     (*Q, "--method", "awq", "--awq-artifact", "{x}/nope.safetensors"), "does not exist"),
    (P2, "quantize with an unknown option", (*Q, "--bitz", "4"), "unrecognized arguments"),
    (P2, "quantize --bits without a value", (*Q, "--bits"), "expected one argument"),
    (P2, "eval --seqlen 1", (*E, "--seqlen", "1"), "greater than or equal to 2"),
    (P2, "eval --stride 0", (*E, "--stride", "0"), "greater than or equal to 1"),
    (P2, "eval --batch-size 0", (*E, "--batch-size", "0"), "greater than or equal to 1"),
    (P2, "eval --limit 0", (*E, "--tasks", "qcal_nextsent_en", "--limit", "0"), "greater than or equal to 1"),
    (P2, "eval --num-fewshot -1", (*E, "--tasks", "qcal_nextsent_en", "--num-fewshot", "-1"), ">= 0"),
    (P2, "eval --ece-bins 0", (*E, "--ece-bins", "0"), "[1, 1000]"),
    (P2, "eval --ece-bins 10^9", (*E, "--ece-bins", "1000000000"), "[1, 1000]"),
    (P2, "eval --task-limit mmlu=0", (*E, "--tasks", "mmlu", "--task-limit", "mmlu=0"), "positive number"),
    (P2, "eval --task-limit for a task not in --tasks",
     (*E, "--tasks", "mmlu", "--task-limit", "arc=5"), "not in --tasks"),
    (P2, "eval --confidence without --tasks", (*E, "--confidence"), "add --tasks"),
    (P2, "eval --text <missing file>", (*E, "--text", "{x}/nope.txt"), "does not exist"),
    (P2, "eval --include-path <missing dir>",
     (*E, "--tasks", "qcal_nextsent_en", "--include-path", "{x}/nodir"), "does not exist"),
    (P2, "eval --backend tpu", (*E, "--backend", "tpu"), "choose one of hf, vllm"),
    (P2, "calib build --n 0", (*B, "--n", "0"), "--n 0"),
    (P2, "calib build --weights a,b", (*B, "--selector", "multilingual", "--langs", "en,de",
                                        "--weights", "a,b"), "give numbers"),
    (P2, "calib build --weights 1,-1", (*B, "--selector", "multilingual", "--langs", "en,de",
                                         "--weights", "1,-1"), "must be > 0"),
    (P2, "calib build --mode sideways", (*B, "--mode", "sideways"), "--mode sideways"),
    (P2, "calib build --objective foo", (*B, "--objective", "foo"), "--objective foo"),
    (P2, "calib build --pool-size 0", (*B, "--pool-size", "0"), "greater than or equal to 1"),
    (P2, "compare --nsamples 0", (*C, "--nsamples", "0"), "greater than or equal to 1"),
    (P2, "compare --jobs 0", (*C, "--jobs", "0"), "greater than or equal to 1"),
    (P2, "compare --shard 5/4", (*C, "--shard", "5/4"), "0 <= I < N"),
    (P2, "compare --shard x", (*C, "--shard", "x"), "is not I/N"),
    (P2, "compare --address without --executor ray", (*C, "--address", "ray://h:1"), "--executor ray"),
    (P2, "compare --config <missing file>", (*C, "--config", "{x}/nope.yaml"), "does not exist"),
    (P2, "export --format gguf", ("export", "--model", "{x}/mymodel", "--format", "gguf", "-o",
                                  "{x}/o"), "not a choice"),
    (P2, "provision --only modle", ("provision", "--only", "modle"), "did you mean 'model'"),
    (P3, "quantize --desc-act --format awq", (*G, "--desc-act", "--format", "awq"),
     "cannot be stored in --format awq"),
    (P3, "quantize --allow-ragged-groups --format compressed-tensors",
     (*Q, "--group-size", "48", "--allow-ragged-groups", "--format", "compressed-tensors"),
     "needs whole groups"),
    (P3, "quantize --allow-ragged-groups --format awq",
     (*Q, "--group-size", "48", "--allow-ragged-groups", "--format", "awq"), "needs whole groups"),
    (P3, "quantize --bits 3 --format awq (cannot be packed)",
     (*G, "--bits", "3", "--format", "awq"), "cannot be packed in --format awq"),
    (P3, "quantize --bits 5", (*Q, "--bits", "5"), "cannot be packed"),
    (P3, "quantize --bits 8 --format awq", (*Q, "--bits", "8", "--format", "awq"),
     "choose --bits 4"),
    (P3, "quantize --eval --eval-langs xx", (*Q, "--eval", "--eval-langs", "en,xx"),
     "'xx' is not in debian-handbook"),
    (P3, "quantize --awq-artifact with --method gptq",
     (*G, "--awq-artifact", "{x}/calib.txt"), "use it with --method awq"),
    (P3, "compare --bits 6", (*C, "--bits", "6"), "cannot be packed"),
    (P3, "calib build --langs xx (packaged corpus)",
     ("calib", "build", "--langs", "en,xx", "-o", "{x}/set"), "'xx' is not in debian-handbook"),
    (P3, "calib build --selector ml:xx (packaged corpus)",
     ("calib", "build", "--selector", "ml:xx", "-o", "{x}/set"), "--selector language 'xx'"),
    (P3, "quantize --selector ml:xx (packaged corpus)",
     ("quantize", "--method", "gptq", "--selector", "ml:qq", "-o", "{x}/o"), "not in debian-handbook"),
    (P5, "eval --langs ../../x", (*E, "--langs", "../../x"), "not a plain name"),
    (P5, "eval --langs xx", (*E, "--langs", "en,xx"), "'xx' is not in debian-handbook"),
    (P5, "eval --source ../../x", (*E, "--source", "../../x"), "not a plain name"),
    (P5, "quantize --eval --eval-langs ../../x", (*Q, "--eval", "--eval-langs", "../../x"),
     "not a plain name"),
    (P5, "quantize --calib ../../x", (*G, "--calib", "../../x"), "not a plain name"),
    (P5, "quantize --calib <missing .txt>", (*G, "--calib", "{x}/nope.txt"), "does not exist"),
    (P5, "quantize --selector ml:../../x", (*G, "--selector", "ml:../../x"), "not a plain name"),
    (P5, "quantize --selector mix:../x=1", (*G, "--selector", "mix:../x=1"), "not a plain name"),
    (P5, "calib build --selector ml:../../x", (*B, "--selector", "ml:../../x"), "not a plain name"),
    (P5, "calib build --source ../../x", ("calib", "build", "--source", "../../x"), "not a plain name"),
    (P5, "calib build --langs ../x", (*B, "--langs", "en,../x"), "not a plain name"),
    (P5, "calib build --mix ../x=1", (*B, "--selector", "multilingual", "--mix", "../x=1"),
     "not a plain name"),
    (P5, "compare --source ../../x", (*C[:-4], "--source", "../../x", *C[-2:]), "not a plain name"),
    (P5, "compare --eval-langs ../x", (*C, "--eval-langs", "../x"), "not a plain name"),
    (P5, "compare --selectors ml:../../x", (*C, "--methods", "gptq", "--selectors", "ml:../../x"),
     "not a plain name"),
]


def _argv(argv: tuple[str, ...], x: Path, t: Path) -> list[str]:
    """The case's words; where a case re-gives an option of its base command (its bad
    --calib after the base's good one), the base's is dropped: an option given twice is a
    refusal of its own (test_bad_input_options.py)."""
    words = [a.format(x=x, t=t) for a in argv]
    for i in range(len(words) - 2, -1, -1):
        if words[i].startswith("--") and words[i] in words[i + 1:] and i + 1 < len(words) \
                and not words[i + 1].startswith("-"):
            del words[i:i + 2]
    return words


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(("pattern", "case", "argv", "match"), CLI_CASES,
                         ids=[c[1] for c in CLI_CASES])
def test_option_refused_before_any_work(cli: Cli, home: Path, tmp_path: Path, pattern: str,
                                        case: str, argv: tuple[str, ...], match: str) -> None:
    before = _tree(tmp_path)
    loaded = set(sys.modules)
    cli.refused(*_argv(argv, home, tmp_path), match=match, case=case, pattern=pattern)
    assert _tree(tmp_path) == before, _tree(tmp_path) - before  # no output, work or results dir
    assert "transformers.models.llama.modeling_llama" not in set(sys.modules) - loaded


GRID_CASES = [
    ("nsamples: abc", "nsamples 'abc'"),
    ("seqlen: abc", "seqlen 'abc'"),
    ("group_size: big", "group_size 'big'"),
    ("selectors: 5", "valid list"),
    ("tasks: 7", "valid list"),
    ("methods: [gptq]\nmethod_options: {gptq: {damp_percent: lots}}", "damp_percent 'lots'"),
    ("methods: [gptq]\nmethod_options: {gptq: {dmap_percent: 0.1}}", "did you mean 'damp_percent'"),
    ("nsamples: 2.7", "nsamples 2.7"),
    ('sym: "false"', "sym 'false'"),
    ("desc_act: yes please", "desc_act 'yes please'"),
    ('confidence: "true"', "confidence 'true'"),
    ("sym: [false, 'true']", "sym 'true'"),
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("{}", "is empty"),
    ("methods: [rtn\nselectors: random", "not valid YAML (line"),
    ("methods: rtn\n  bad indent: 1", "not valid YAML (line"),
    ("- rtn\n- gptq", "must be a mapping"),
    ("nsample: 4", "did you mean 'nsamples'"),
    ("selector: [random]", "did you mean 'selectors'"),
    ("max_windows: -1", "max_windows -1"),
    ("max_windows: 0", "max_windows 0"),
    ("seed: -1", "seed -1"),
    ("seeds: [0, 1, -2]", "seed -2"),
    ("bits: 7", "cannot be packed"),
    ("bits: [4, 5]", "cannot be packed"),
    ("limit: 0", "limit 0"),
    ("tasks: [qcal_nextsent_en]\ntask_limits: {qcal_nextsent_en: 0}", "task_limits"),
    ("task_limits: {mmlu: 5}", "not in --tasks"),
    ("eval_langs: [en, ../x]", "not a plain name"),
    ("source: ../../x", "not a plain name"),
    ("selectors: [random, ml:../../x]", "not a plain name"),
    ("methods: [rtn, gtpq]", "did you mean 'gptq'"),
    ("eval_seqlen: 1", "eval_seqlen 1"),
    ("name: ../escape", "not a plain name"),
]


@pytest.mark.parametrize(("text", "match"), GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_grid_yaml_refused_before_any_cell(cli: Cli, home: Path, tmp_path: Path, text: str,
                                           match: str) -> None:
    grid = home / "grid.yaml"
    grid.write_text(text)
    before = _tree(tmp_path)
    argv = ["compare", "--config", grid, "--model", home / "mymodel", "--results-dir",
            tmp_path / "results"]
    cli.refused(*argv, match=match, case=f"grid YAML `{text.splitlines()[0] if text else ''}`"
                + (" (+1 line)" if text.count("\n") else "") if text.strip() else
                "grid YAML empty or only a comment", pattern=P1)
    assert _tree(tmp_path) == before


def test_override_is_checked_like_the_file(cli: Cli, home: Path, tmp_path: Path) -> None:
    grid = home / "grid.yaml"
    grid.write_text("methods: [rtn]\nselectors: [random]\n")
    cli.refused("compare", "--config", grid, "--seqlen", "x", "--results-dir", tmp_path / "r",
                match="--seqlen x", case="compare --config ok.yaml --seqlen x", pattern=P1)
    assert not (tmp_path / "r").exists()
