"""`qcal eval`: perplexity per language (and, where built, lm-eval tasks and calibration)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a float model or a qcal checkpoint")
    p.add_argument("--model", default=None, help="model dir or checkpoint (default: embedded)")
    p.add_argument("--ppl", action="store_true", help="perplexity on held-out text (default)")
    p.add_argument("--langs", default="en", help="comma-separated languages, or 'all'")
    p.add_argument("--source", default="debian-handbook", help="packaged corpus")
    p.add_argument("--text", type=Path, default=None, help="evaluate on this text file instead")
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--stride", type=int, default=None, help="sliding-window mode")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-windows", type=int, default=None, help="cap windows per language")
    p.add_argument("-o", "--output", type=Path, default=None, help="write results JSON here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from qcal.data import available_languages
    from qcal.pipeline import evaluate_perplexity

    langs = available_languages(args.source) if args.langs == "all" else args.langs.split(",")
    result = evaluate_perplexity(args.model, langs, args.seqlen, args.stride, args.batch_size,
                                 args.max_windows, args.text, args.source)
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.output.with_suffix(args.output.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.output)
    print(f"{'lang':>6}  {'ppl':>10}  {'tokens':>8}")
    for lang, row in result["perplexity"].items():
        print(f"{lang:>6}  {row['ppl']:>10.3f}  {row['tokens']:>8}")
    return 0
