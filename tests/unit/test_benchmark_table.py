"""The benchmark table on synthetic cells: groups expand one level, seeds average."""

from __future__ import annotations

import pytest

from qcal.studies.benchmarks import (
    benchmark_table,
    cell_text,
    combined_table,
    delta_text,
    findings,
    items_scored,
    method_pair_tests,
    pair_findings,
    share_text,
)

pytestmark = pytest.mark.unit

INFO = {"group_subtasks": {"mmlu": ["mmlu_stem", "mmlu_other"],
                           "mmlu_stem": ["mmlu_physics", "mmlu_math"],
                           "mmlu_other": ["mmlu_law"]},
        "n_samples": {"mmlu_physics": {"original": 100, "effective": 50},
                      "mmlu_math": {"original": 90, "effective": 50},
                      "mmlu_law": {"original": 40, "effective": 40},
                      "lambada_openai": {"original": 5153, "effective": 1000}}}


def _results(shift: float) -> dict:
    row = {"acc,none": 0.5 + shift, "acc_stderr,none": 0.02, "sample_len": 10}
    return {"mmlu": row, "mmlu_stem": {**row, "acc,none": 0.4 + shift},
            "mmlu_other": {**row, "acc,none": 0.6 + shift}, "mmlu_physics": row,
            "lambada_openai": {"acc,none": 0.3 + shift, "acc_stderr,none": 0.01,
                               "perplexity,none": 20.0 + 10 * shift,
                               "perplexity_stderr,none": 1.5}}


def _cell(method: str | None, seed: int, shift: float) -> dict:
    return {"method": method, "selector": None if method in (None, "rtn") else "random",
            "axes": {"seed": seed},
            "eval": {"lm_eval": {"results": {"model": _results(shift)}, "info": INFO}}}


def test_groups_expand_one_level_and_seeds_average() -> None:
    cells = {"float": _cell(None, 0, 0.0), "none__rtn": _cell("rtn", 0, -0.1),
             "random__gptq__s0": _cell("gptq", 0, -0.02), "random__gptq__s1": _cell("gptq", 1, -0.04)}
    rows = benchmark_table(cells, ["mmlu", "lambada_openai"])
    assert [(r["task"], r["depth"]) for r in rows if r["model"] == "float"] == [
        ("mmlu", 0), ("mmlu_stem", 1), ("mmlu_other", 1), ("lambada_openai", 0)]
    gptq = {r["task"]: r for r in rows if r["model"] == "gptq"}
    assert gptq["mmlu"]["seeds"] == 2 and gptq["mmlu"]["acc"] == pytest.approx(0.47)
    assert gptq["mmlu"]["items"] == 140 and gptq["mmlu_stem"]["items"] == 100
    assert gptq["lambada_openai"]["items"] == 1000
    lam = next(r for r in rows if r["model"] == "rtn" and r["task"] == "lambada_openai")
    assert cell_text(lam, "perplexity") == "19.00 ± 1.50"
    assert cell_text(lam, "acc") == "0.2000 ± 0.0100" and cell_text(lam, "acc_norm") == "-"


def test_items_fall_back_to_sample_len() -> None:
    assert items_scored("arc_easy", {"arc_easy": {"sample_len": 570}}, {}) == 570
    assert items_scored("mmlu", {}, {"group_subtasks": {"mmlu": ["a", "b"]},
                                     "n_samples": {"a": {"effective": 3}}}) is None


def test_combined_table_takes_each_task_from_the_first_grid_that_ran_it() -> None:
    bench = {"float": _cell(None, 0, 0.0), "random__gptq__s0": _cell("gptq", 0, -0.02)}
    confidence = {"float": _cell(None, 0, 0.1), "random__gptq__s0": _cell("gptq", 0, 0.0),
                  "random__gptq__s1": _cell("gptq", 1, 0.02)}
    rows = combined_table([(bench, ["mmlu"]), (confidence, ["mmlu", "lambada_openai"])])
    assert {(r["task"], r["source"]) for r in rows if r["depth"] == 0} == {
        ("mmlu", 0), ("lambada_openai", 1)}
    mmlu = next(r for r in rows if r["task"] == "mmlu" and r["model"] == "float")
    assert mmlu["acc"] == pytest.approx(0.5)  # the benchmark grid's, not the confidence grid's
    lam = next(r for r in rows if r["task"] == "lambada_openai" and r["model"] == "gptq")
    assert lam["seeds"] == 2 and lam["acc"] == pytest.approx(0.31)


def test_answer_shares_show_a_model_that_always_gives_one_answer() -> None:
    """Gold answers 0,0,0,1 (majority 0.75); the float model always picks choice 2, the
    quantized one follows the gold answer; a group collects its subtasks' items."""
    gold = [0, 0, 0, 1]

    def items(picks: list[int]) -> list[dict]:
        return [{"lls": [0.0 if c == p else -5.0 for c in range(3)], "gold": g}
                for p, g in zip(picks, gold, strict=True)]

    info = {"group_subtasks": {"emo": ["emo_en", "emo_de"]}}
    results = {t: {"acc,none": 0.5, "acc_stderr,none": 0.1} for t in ("emo", "emo_en", "emo_de")}
    results["plain"] = {"acc,none": 0.3}

    def cell(method: str | None, picks: list[int]) -> dict:
        return {"method": method, "selector": None, "axes": {},
                "items": {"emo_en": items(picks), "emo_de": items(picks),
                          "plain": [{"lls": [-1.0], "gold": 0}]},
                "eval": {"lm_eval": {"results": {"model": results}, "info": info}}}

    rows = benchmark_table({"float": cell(None, [2, 2, 2, 2]), "none__rtn": cell("rtn", gold)},
                           ["emo", "plain"])
    by = {(r["task"], r["model"]): r for r in rows}
    assert by[("emo", "float")]["majority"] == 0.75 and by[("emo", "float")]["top_answer"] == 1.0
    assert by[("emo_de", "rtn")]["top_answer"] == 0.75
    assert share_text(by[("emo", "float")], "top_answer") == "1.00"
    assert "majority" not in by[("plain", "float")]  # one 'choice': no answer to prefer
    assert share_text(by[("plain", "float")], "majority") == "-"


def _mc_cell(method: str | None, seed: int, picks: list[int], gold: list[int]) -> dict:
    """A cell whose multiple-choice items pick `picks` (3 choices each); lm-eval's acc is
    consistent with them."""
    items = [{"doc_id": i, "lls": [0.0 if c == p else -3.0 for c in range(3)], "gold": g}
             for i, (p, g) in enumerate(zip(picks, gold, strict=True))]
    acc = sum(p == g for p, g in zip(picks, gold, strict=True)) / len(gold)
    results = {"mc": {"acc,none": acc, "acc_stderr,none": 0.05},
               "lambada_openai": {"acc,none": 0.3, "perplexity,none": 20.0}}
    return {"method": method, "selector": None if method in (None, "rtn") else "random",
            "axes": {"seed": seed},
            "items": {"mc": items, "lambada_openai": [{"doc_id": 0, "lls": [-2.0], "gold": 0}]},
            "eval": {"lm_eval": {"results": {"model": results}, "info": {}}}}


def test_method_rows_carry_a_paired_accuracy_test_against_float() -> None:
    """40 items: float right on all; RTN wrong on the first 20 (a real drop); GPTQ's two
    seeds each wrong on one different item (a 0.025 drop that 40 items cannot confirm)."""
    gold = [0] * 40
    rtn = [1] * 20 + [0] * 20
    s0, s1 = [1] + [0] * 39, [0, 1] + [0] * 38
    cells = {"float": _mc_cell(None, 0, gold, gold), "none__rtn": _mc_cell("rtn", 0, rtn, gold),
             "random__gptq__s0": _mc_cell("gptq", 0, s0, gold),
             "random__gptq__s1": _mc_cell("gptq", 1, s1, gold)}
    rows = combined_table([(cells, ["mc", "lambada_openai"])])
    by = {(r["task"], r["model"]): r for r in rows}
    assert "acc_test" not in by[("mc", "float")]
    assert "acc_test" not in by[("lambada_openai", "rtn")]  # one continuation: no answer
    rtn_test, gptq_test = by[("mc", "rtn")]["acc_test"], by[("mc", "gptq")]["acc_test"]
    # the delta is the table's own accuracy difference (seeds averaged per item)
    assert rtn_test["delta"] == pytest.approx(by[("mc", "rtn")]["acc"] - 1.0) == -0.5
    assert gptq_test["delta"] == pytest.approx(by[("mc", "gptq")]["acc"] - 1.0) == -0.025
    assert rtn_test["units"] == gptq_test["units"] == 40
    # Holm over the table's two tests: the larger p is kept, the smaller doubled
    assert rtn_test["significant_holm"] and not gptq_test["significant_holm"]
    assert gptq_test["p_holm"] >= gptq_test["p_bootstrap"]
    assert rtn_test["p_holm"] == pytest.approx(min(1.0, 2 * rtn_test["p_bootstrap"]))
    text, p = delta_text(by[("mc", "rtn")])
    assert text.startswith("-0.5000 [") and p.endswith(" *")
    assert delta_text(by[("mc", "float")]) == ("-", "-")


def test_items_that_do_not_line_up_get_no_test() -> None:
    gold = [0, 1, 2, 0]
    other = _mc_cell("rtn", 0, gold, gold)
    other["items"]["mc"] = other["items"]["mc"][:3]  # an item missing: not the same items
    rows = combined_table([({"float": _mc_cell(None, 0, gold, gold), "none__rtn": other},
                            ["mc"])])
    assert all("acc_test" not in r for r in rows)


def test_findings_name_the_changes_that_survive_holm_and_the_baseline_tasks() -> None:
    gold = [0] * 30 + [1] * 10  # majority 0.75
    rtn = [1] * 30 + [1] * 10  # always answers 1: acc 0.25, one answer on every item
    cells = {"float": _mc_cell(None, 0, gold, gold), "none__rtn": _mc_cell("rtn", 0, rtn, gold)}
    found = findings(combined_table([(cells, ["mc", "lambada_openai"])]))
    assert found[0].startswith("- **rtn** vs float over 1 tasks: mean Δacc -0.7500")
    assert "1 change(s) survive Holm: mc -0.750" in found[0]
    assert found[1].startswith("- At the baseline") and "mc (rtn)" in found[1]
    assert "float" not in found[1]  # float is right on every item: skill, not bias


def test_a_task_whose_gold_is_always_one_choice_is_not_called_baseline() -> None:
    """SciQ's gold is always the same choice (majority 1.0): a model right on 3 of 4 items
    that spreads its picks shows skill; one at a uniform guess's accuracy does not."""
    gold = [2] * 40
    skilled = [2, 2, 2, 0] * 10  # acc 0.75, top answer 0.75
    guessing = [0, 1, 2] * 13 + [0]  # acc 0.325, chance 1/3
    rows = combined_table([({"float": _mc_cell(None, 0, skilled, gold),
                             "none__rtn": _mc_cell("rtn", 0, guessing, gold)}, ["mc"])])
    by = {r["model"]: r for r in rows}
    assert by["float"]["majority"] == 1.0 and by["float"]["chance"] == pytest.approx(1 / 3)
    baseline = findings(rows)[-1]
    assert baseline.startswith("- At the baseline") and "mc (rtn)" in baseline
    assert "float" not in baseline


def test_lambada_gets_a_paired_test_on_its_greedy_flags_where_cells_kept_them() -> None:
    """30 LAMBADA items: float greedy-right on 20; RTN right on 5 of those (a real drop);
    a cell from before qcal kept the flags gets no test rather than a wrong one."""
    def with_flags(cell: dict, flags: list[bool]) -> dict:
        cell["eval"]["lm_eval"]["continuation_items"] = {"lambada_openai": [
            {"doc_id": i, "ll": -1.0, "greedy": f} for i, f in enumerate(flags)]}
        return cell

    base = [True] * 20 + [False] * 10
    rtn = [True] * 5 + [False] * 25
    cells = {"float": with_flags(_cell(None, 0, 0.0), base),
             "none__rtn": with_flags(_cell("rtn", 0, -0.1), rtn),
             "random__gptq__s0": _cell("gptq", 0, -0.02)}
    by = {r["model"]: r for r in combined_table([(cells, ["lambada_openai"])])}
    test = by["rtn"]["acc_test"]
    assert test["delta"] == pytest.approx(-0.5) and test["units"] == 30
    assert test["significant_holm"]
    assert "acc_test" not in by["gptq"] and "acc_test" not in by["float"]


def test_methods_are_tested_against_each_other_on_the_same_items() -> None:
    """40 items, float right on all: RTN wrong on 20, AWQ on 2 (AWQ beats RTN for real),
    GPTQ's two seeds on 20 and 18 (19 on average: no better than RTN, worse than AWQ)."""
    gold = [0] * 40
    rtn = [1] * 20 + [0] * 20
    awq = [1] * 2 + [0] * 38
    gptq_s0, gptq_s1 = [1] * 20 + [0] * 20, [0] * 2 + [1] * 18 + [0] * 20
    cells = {"float": _mc_cell(None, 0, gold, gold), "none__rtn": _mc_cell("rtn", 0, rtn, gold),
             "random__awq__s0": _mc_cell("awq", 0, awq, gold),
             "random__gptq__s0": _mc_cell("gptq", 0, gptq_s0, gold),
             "random__gptq__s1": _mc_cell("gptq", 1, gptq_s1, gold)}
    pairs = method_pair_tests([(cells, ["mc", "lambada_openai"])])
    by = {(p["a"], p["b"]): p["test"] for p in pairs}
    # lambada here kept no greedy flags: only mc is tested, once per pair
    assert [p["task"] for p in pairs] == ["mc"] * 3 and set(by) == {
        ("awq", "rtn"), ("gptq", "rtn"), ("awq", "gptq")}
    assert by[("awq", "rtn")]["delta"] == pytest.approx(0.45)
    assert by[("gptq", "rtn")]["delta"] == pytest.approx(0.025)  # seeds averaged per item
    assert by[("awq", "gptq")]["delta"] == pytest.approx(0.425)
    assert by[("awq", "rtn")]["significant_holm"] and by[("awq", "gptq")]["significant_holm"]
    assert not by[("gptq", "rtn")]["significant_holm"]
    assert all(t["p_holm"] >= t["p_bootstrap"] for t in by.values())
    found = pair_findings(pairs)
    assert found[0].startswith("- **awq vs rtn** over 1 tasks: mean Δacc +0.4500")
    assert "awq on 1 (mc +0.450)" in found[0]
    assert found[1].endswith("neither, on any task.")


def test_a_method_pair_is_left_out_where_one_side_lacks_items() -> None:
    gold = [0, 1, 2, 0]
    awq = _mc_cell("awq", 0, gold, gold)
    awq["items"]["mc"] = awq["items"]["mc"][:3]  # not the same items as RTN's
    cells = {"float": _mc_cell(None, 0, gold, gold), "none__rtn": _mc_cell("rtn", 0, gold, gold),
             "random__awq__s0": awq}
    assert method_pair_tests([(cells, ["mc"])]) == []
    assert pair_findings([]) == []
