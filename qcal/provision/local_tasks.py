"""Build qcal's offline lm-eval tasks (next-sentence multiple choice) from held-out text.

Items come only from the eval split of a packaged corpus (held-out chapters), so no
calibration text leaks into them. Writes, per language, `qcal_nextsent_<lang>.yaml` +
`.jsonl`, the group `qcal_nextsent.yaml`, and `manifest.json` into --out (default: the
package's task directory, qcal/eval/tasks/). Deterministic for a given corpus and seed.

    python -m qcal.provision.local_tasks                      # en de fr es ru ja zh, 200 each
    python -m qcal.provision.local_tasks --langs en,it --n-items 100 --out /tmp/tasks
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qcal.data import load_documents, read_stats
from qcal.eval.local_tasks import (
    GROUP_NAME,
    TASK_PREFIX,
    build_nextsent_items,
    group_yaml,
    tasks_dir,
    write_task,
)
from qcal.results import atomic_write_text

DEFAULT_LANGS = "en,de,fr,es,ru,ja,zh"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--langs", default=DEFAULT_LANGS)
    ap.add_argument("--source", default="debian-handbook")
    ap.add_argument("--n-items", type=int, default=200)
    ap.add_argument("--context-sentences", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=tasks_dir())
    args = ap.parse_args(argv)

    langs = [x.strip() for x in args.langs.split(",") if x.strip()]
    manifest = {"source": args.source, "split": "eval", "seed": args.seed,
                "n_items_requested": args.n_items, "context_sentences": args.context_sentences,
                "builder": "python -m qcal.provision.local_tasks", "tasks": {}}
    try:
        stats = read_stats(args.source)
        manifest["source_package"] = stats.get("package")
        manifest["license"] = stats.get("license")
    except Exception as err:  # stats are provenance only; the documents are what matter
        print(f"note: no corpus stats ({err})", file=sys.stderr)
    names = []
    for lang in langs:
        docs = load_documents(args.source, [lang], split="eval")
        items = build_nextsent_items([(d.doc_id, d.text) for d in docs], lang, args.n_items,
                                     args.context_sentences, seed=args.seed)
        name = f"{TASK_PREFIX}_{lang}"
        desc = (f"next-sentence choice ({lang}), {len(items)} items from the held-out chapters "
                f"of {args.source}; built by python -m qcal.provision.local_tasks "
                f"--seed {args.seed}")
        write_task(args.out, name, items, lang, desc)
        names.append(name)
        manifest["tasks"][name] = {"lang": lang, "items": len(items),
                                   "documents": len({it["doc_id"] for it in items})}
        print(f"{name}: {len(items)} items")
    atomic_write_text(args.out / f"{GROUP_NAME}.yaml", group_yaml(GROUP_NAME, names))
    atomic_write_text(args.out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(names)} tasks + group {GROUP_NAME} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
