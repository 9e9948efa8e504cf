"""Small offline multiple-choice tasks for lm-eval, built from held-out text.

"Next sentence" items: the context is a few consecutive sentences of one document,
the choices are the true next sentence plus distractor sentences of similar length
drawn from *other* documents of the same language. Built only from the eval split of
a packaged corpus, so no calibration text leaks into them.

Each task is a directory entry pair `<name>.yaml` + `<name>.jsonl`; the YAML loads the
JSONL through `loader.py` next to it (`custom_dataset: !function loader.load`), which
resolves the file relative to the YAML, so the tasks work wherever the package lives,
from qcal or from lm-eval's own CLI (`lm_eval --include_path <dir>`).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qcal.errors import QcalError

TASK_PREFIX = "qcal_nextsent"
GROUP_NAME = TASK_PREFIX
CJK_LANGS = frozenset({"ja", "zh", "zh-CN", "zh-TW", "ko"})  # no spaces between sentences
N_CHOICES = 4


class LocalTaskError(QcalError, ValueError):
    """A local task's item file is missing, empty or malformed."""


def tasks_dir() -> Path:
    """The packaged task directory (YAMLs + JSONL + loader.py)."""
    return Path(__file__).resolve().parent / "tasks"


def local_task_names(directory: Path | None = None) -> list[str]:
    root = directory or tasks_dir()
    return sorted(p.stem for p in root.glob("*.yaml")) if root.is_dir() else []


# A sentence ends at ., !, ? or an ellipsis (optionally followed by closing quotes or
# brackets) when whitespace and a capital, digit or opening quote follow.
_LATIN_END = re.compile(r"([.!?\u2026][\"'\u00bb\u201d\u2019)\]]*)\s+(?=[\"'\u00ab\u201c\u00bf\u00a1(]?"
                        r"[A-Z0-9\u00c0-\u00de\u0391-\u03a9\u0400-\u042f])")
_CJK_END = re.compile(r"([\u3002\uff01\uff1f][\u300d\u300f\uff09\u201d]*)")


def split_sentences(text: str, lang: str) -> list[str]:
    """Sentences of `text`; paragraph breaks (newlines) always end a sentence."""
    out: list[str] = []
    for para in text.split("\n"):
        para = para.strip()
        if not para:
            continue
        if lang in CJK_LANGS:
            parts = _CJK_END.split(para)
            # re.split with a group alternates text and terminator: glue them back.
            sents = ["".join(parts[i:i + 2]) for i in range(0, len(parts), 2)]
        else:
            sents = _LATIN_END.sub(lambda m: m.group(1) + "\n", para).split("\n")
        out.extend(s.strip() for s in sents if s.strip())
    return out


def _length_ok(sentence: str, lang: str) -> bool:
    lo, hi = (12, 100) if lang in CJK_LANGS else (40, 250)
    letters = sum(ch.isalpha() for ch in sentence)
    return lo <= len(sentence) <= hi and letters >= 0.6 * len(sentence.replace(" ", ""))


def _section(doc_id: str) -> str:
    """Packaged doc ids read `<source>/<lang>/<split>/<section>/<n>`: drop the counter."""
    return doc_id.rsplit("/", 1)[0]


def build_nextsent_items(
    docs: Sequence[tuple[str, str]], lang: str, n_items: int = 200, context_sentences: int = 3,
    min_context: int = 2, seed: int = 0, max_length_ratio: float = 1.35,
    section_of: Callable[[str], str] = _section,
) -> list[dict[str, Any]]:
    """Next-sentence items from `(doc_id, text)` pairs of one language.

    The context is the up to `context_sentences` (at least `min_context`) sentences
    before the target. Distractors come from other sections (`section_of(doc_id)`) and
    have a character length within `max_length_ratio` of the true sentence, so length
    alone (and `acc_norm`) gives no cue. Documents are visited round robin in a seeded
    order to spread items over the text.
    """
    if n_items < 1 or not 1 <= min_context <= context_sentences:
        raise LocalTaskError("need n_items >= 1 and 1 <= min_context <= context_sentences")
    rng = np.random.default_rng(seed)
    sents = [(doc_id, split_sentences(text, lang)) for doc_id, text in docs]
    pool = [(section_of(d), s) for d, ss in sents for s in ss if _length_ok(s, lang)]
    if len({d for d, _ in pool}) < 2:
        raise LocalTaskError(f"language {lang!r}: distractors need sentences from at least two "
                             "sections; give more text")
    pool_len = np.array([len(s) for _, s in pool], dtype=np.float64)
    pool_doc = np.array([d for d, _ in pool], dtype=object)
    positions = {d: [i for i in range(min_context, len(ss)) if _length_ok(ss[i], lang)]
                 for d, ss in sents}
    for d in positions:
        rng.shuffle(positions[d])
    order = [d for d, _ in sents if positions[d]]
    rng.shuffle(order)
    by_id = dict(sents)
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(items) < n_items and any(positions[d] for d in order):
        for d in order:
            if len(items) >= n_items or not positions[d]:
                continue
            i = positions[d].pop()
            ss = by_id[d]
            gold_text = ss[i]
            ratio = pool_len / len(gold_text)
            ok = np.flatnonzero((pool_doc != section_of(d)) & (ratio <= max_length_ratio)
                                & (ratio >= 1 / max_length_ratio))
            candidates = [pool[j][1] for j in rng.permutation(ok)]
            distractors = list(dict.fromkeys(c for c in candidates if c != gold_text))[:N_CHOICES - 1]
            if len(distractors) < N_CHOICES - 1 or gold_text in seen:
                continue
            seen.add(gold_text)
            gold = int(rng.integers(N_CHOICES))
            choices = distractors[:gold] + [gold_text] + distractors[gold:]
            joiner = "" if lang in CJK_LANGS else " "
            items.append({"id": f"{lang}-{len(items):04d}", "lang": lang, "doc_id": d,
                          "context": joiner.join(ss[max(0, i - context_sentences):i]),
                          "choices": choices, "gold": gold})
    return items


def task_yaml(name: str, jsonl_name: str, lang: str, description: str = "") -> str:
    """lm-eval task config for a local next-sentence task (multiple_choice)."""
    delimiter = "" if lang in CJK_LANGS else " "
    lines = [
        f"# {description}" if description else "# qcal local multiple-choice task",
        f"task: {name}",
        "custom_dataset: !function loader.load",
        "dataset_kwargs:",
        f"  file: {jsonl_name}",
        "test_split: test",
        "output_type: multiple_choice",
        # Column names, not Jinja templates: values reach lm-eval verbatim.
        "doc_to_text: context",
        "doc_to_choice: choices",
        "doc_to_target: gold",
        f"target_delimiter: {json.dumps(delimiter)}",
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: acc_norm",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
    ]
    return "\n".join(lines) + "\n"


def group_yaml(group: str, tasks: Sequence[str]) -> str:
    lines = [f"group: {group}", "task:"] + [f"  - {t}" for t in tasks] + [
        "aggregate_metric_list:",
        "  - metric: acc",
        "    weight_by_size: true",
        "  - metric: acc_norm",
        "    weight_by_size: true",
        "metadata:",
        "  version: 1.0",
    ]
    return "\n".join(lines) + "\n"


def write_task(out_dir: Path | str, name: str, items: Sequence[dict[str, Any]], lang: str,
               description: str = "") -> Path:
    """Write `<name>.jsonl` + `<name>.yaml` (and loader.py if absent) into `out_dir`."""
    from qcal.results import atomic_write_text

    out = Path(out_dir)
    validate_items(items, f"task {name}")
    body = "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items)
    atomic_write_text(out / f"{name}.jsonl", body)
    atomic_write_text(out / f"{name}.yaml", task_yaml(name, f"{name}.jsonl", lang, description))
    loader = out / "loader.py"
    if not loader.exists():
        shutil.copyfile(tasks_dir() / "loader.py", loader)
    return out / f"{name}.yaml"


def validate_items(items: Sequence[dict[str, Any]], where: str) -> None:
    if not items:
        raise LocalTaskError(f"{where} has no items; rebuild it (python -m "
                             "qcal.provision.local_tasks) or point --include-path at a "
                             "directory with non-empty item files")
    for k, it in enumerate(items):
        choices, gold = it.get("choices"), it.get("gold")
        if not isinstance(it.get("context"), str) or not isinstance(choices, list) \
                or len(choices) < 2 or not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise LocalTaskError(
                f"{where}, item {k}: needs a string 'context', a list of >= 2 'choices' and an "
                f"integer 'gold' index into them; got keys {sorted(it)}"
            )


def read_items(path: Path | str) -> list[dict[str, Any]]:
    """Items of a JSONL file, validated; clear errors for a missing or empty file."""
    path = Path(path)
    if not path.is_file():
        raise LocalTaskError(f"item file {path} does not exist; run "
                             "`python -m qcal.provision.local_tasks` or fix the task YAML")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise LocalTaskError(f"{path}:{n} is not valid JSON ({err})") from None
    validate_items(items, f"item file {path}")
    return items


def load_dataset(file: str, config_source: str | None = None, **_: Any) -> Any:
    """lm-eval `custom_dataset` hook: a DatasetDict with one `test` split."""
    import datasets

    path = Path(file)
    if not path.is_absolute() and config_source:
        path = Path(config_source).parent / path
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(read_items(path))})
