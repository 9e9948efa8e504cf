"""Per-item records from lm-eval's logged samples: gold answers, including WinoGrande's
'multiple input' items whose logged target names no choice."""

from __future__ import annotations

import pytest

from qcal.eval.harness import TaskError, extract_continuations, extract_items

pytestmark = pytest.mark.unit


def _sample(doc_id: int, contexts: list[str], conts: list[str], lls: list[float],
            target: object, acc: float) -> dict:
    return {"doc_id": doc_id, "target": target, "acc": acc,
            "arguments": [(c, t) for c, t in zip(contexts, conts, strict=True)],
            "filtered_resps": [(ll, False) for ll in lls]}


def test_ordinary_items_take_the_target_among_the_choices() -> None:
    s = _sample(3, ["Q:"] * 3, [" a", " b", " c"], [-3.0, -1.0, -2.0], " b".strip(), 1.0)
    [item] = extract_items([s], {"task": "t", "target_delimiter": " "})
    assert item.gold == 1 and item.doc_id == 3 and item.lls == [-3.0, -1.0, -2.0]


def test_multiple_input_gold_comes_from_lm_evals_own_accuracy() -> None:
    """Two contexts, one continuation: the logged target is that continuation (which would
    read as choice 0 every time); lm-eval's per-item acc gives the gold index."""
    right = _sample(0, ["The cup", "The jug"], [" fell.", " fell."], [-9.0, -4.0], "fell.", 1.0)
    wrong = _sample(1, ["The cup", "The jug"], [" fell.", " fell."], [-9.0, -4.0], "fell.", 0.0)
    items = extract_items([wrong, right], {"task": "winogrande"})
    assert [i.gold for i in items] == [1, 0]
    three = _sample(2, ["a", "b", "c"], [" x", " x", " x"], [-1.0, -2.0, -3.0], "x", 0.0)
    with pytest.raises(TaskError, match="multiple-input item with 3 choices"):
        extract_items([three], {"task": "odd"})


def test_a_gold_answer_that_disagrees_with_lm_evals_accuracy_is_refused() -> None:
    s = _sample(5, ["Q:"] * 2, [" yes", " no"], [-1.0, -2.0], "no", 1.0)
    with pytest.raises(TaskError, match="disagrees with lm-eval's own accuracy"):
        extract_items([s], {"task": "t"})


def test_single_continuation_items_keep_log_likelihood_and_greedy_flag_by_doc() -> None:
    samples = [{"doc_id": 7, "filtered_resps": [(-2.5, True)], "acc": 1.0},
               {"doc_id": 2, "filtered_resps": [(-9.0, False)], "acc": 0.0}]
    assert extract_continuations(samples) == [{"doc_id": 2, "ll": -9.0, "greedy": False},
                                              {"doc_id": 7, "ll": -2.5, "greedy": True}]
