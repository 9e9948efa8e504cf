"""`qcal eval`: perplexity per language, lm-eval tasks, confidence calibration, drift vs base."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval", help="evaluate a float model or a qcal checkpoint",
        description="Perplexity on held-out text (the default), lm-eval tasks (--tasks), "
                    "confidence calibration (--confidence) and drift from a float base (--base).")
    p.add_argument("--model", default=None, help="model dir or checkpoint (default: embedded)")
    p.add_argument("--base", default=None,
                   help="float model the checkpoint came from: adds KL/JS, metric deltas, flips")
    p.add_argument("--ppl", action="store_true",
                   help="perplexity on held-out text (default when no --tasks)")
    p.add_argument("--langs", default="en", help="comma-separated languages, or 'all'")
    p.add_argument("--source", default="debian-handbook", help="packaged corpus")
    p.add_argument("--text", type=Path, default=None, help="evaluate on this text file instead")
    p.add_argument("--seqlen", type=int, default=512, help="tokens per window (>= 2)")
    p.add_argument("--stride", type=int, default=None, help="sliding-window mode")
    p.add_argument("--batch-size", type=int, default=4, help="perplexity windows per forward")
    p.add_argument("--max-windows", type=int, default=None, help="cap windows per language")
    p.add_argument("--tasks", default=None,
                   help="comma-separated lm-eval tasks: local (qcal_nextsent_en, ...) or standard")
    p.add_argument("--include-path", type=Path, action="append", default=[],
                   help="extra directory of lm-eval task YAMLs (repeatable)")
    p.add_argument("--limit", type=int, default=None, help="first N items per task")
    p.add_argument("--task-limit", action="append", default=[], metavar="TASK=N",
                   help="first N items of TASK instead of --limit (repeatable; a group's N "
                        "applies to each of its subtasks, e.g. mmlu=50)")
    p.add_argument("--num-fewshot", type=int, default=None,
                   help="few-shot examples per item (default: each task's own)")
    p.add_argument("--task-batch-size", type=int, default=16, help="lm-eval batch size")
    p.add_argument("--confidence", "--calibration", dest="confidence", action="store_true",
                   help="confidence metrics (ECE, Brier, NLL, ...) and a reliability diagram")
    p.add_argument("--ece-bins", type=int, default=15, help="equal-width bins of the ECE")
    p.add_argument("--list-tasks", action="store_true", help="list the local tasks and exit")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"),
                   help="hf: qcal's loader and kernels (default); vllm: lm-eval's vLLM backend on "
                        "the checkpoint directory (GPU machines with vLLM; --tasks only)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: CUDA "
                   "when present)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model directory's own Python code to run (off by default)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="results stem: writes <stem>.json/.md (+ _reliability.png, _items.jsonl, "
                        "_token_nll.safetensors)")
    p.add_argument("--scores", type=Path, default=None, metavar="DIR",
                   help="keep every lm-eval request's log-likelihood in DIR, one file per "
                        "model, as it is computed: a stopped run resumes there, and evals of "
                        "several checkpoints against one --base score the base once")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing <stem>.json/.md files that qcal did not write")
    p.set_defaults(handler=run)


def _command_line() -> str:
    argv = sys.argv[1:] if Path(sys.argv[0]).name in ("qcal", "__main__.py", "cli.py") else None
    return "qcal " + shlex.join(argv) if argv is not None else shlex.join(sys.argv)


def run(args: argparse.Namespace) -> int:
    from qcal.eval.job import run_evaluation
    from qcal.run_config import EvalConfig

    if args.list_tasks:
        from qcal.eval.local_tasks import local_task_names

        print("\n".join(local_task_names()))
        return 0
    if args.output:
        # before the model loads; never inside the model's or the base's folder
        check_eval_output(args.output, args.overwrite, (args.model, args.base))
    tasks = tuple(t for t in (args.tasks or "").split(",") if t.strip())
    ppl = args.ppl or not tasks
    langs: tuple[str, ...] = ()
    if ppl and args.text is None:
        if args.langs == "all":
            from qcal.data import available_languages

            langs = tuple(available_languages(args.source))
        else:
            langs = tuple(x.strip() for x in args.langs.split(",") if x.strip())
    cfg = EvalConfig(seqlen=args.seqlen, stride=args.stride, batch_size=args.batch_size,
                     max_windows=args.max_windows, langs=langs, ppl=ppl, source=args.source,
                     tasks=tasks, limit=args.limit, task_limits=parse_task_limits(args.task_limit),
                     num_fewshot=args.num_fewshot,
                     task_batch_size=args.task_batch_size, confidence=args.confidence,
                     ece_bins=args.ece_bins)
    outcome = run_evaluation(args.model, cfg, base=args.base, text_file=args.text,
                             include_paths=args.include_path,
                             trust_remote_code=args.trust_remote_code, device=args.device,
                             backend=args.backend, score_dir=args.scores)
    from qcal.errors import NumericalError
    from qcal.eval.job import non_finite_metrics

    bad = non_finite_metrics(outcome.data)
    if bad:
        _print_summary(outcome.data)
        raise NumericalError(f"the evaluation produced non-finite results ({', '.join(bad[:3])}); "
                             "the model computes NaN/Inf: check its weights or use float32")
    if args.output:
        from qcal.eval.report import write_outputs

        for what, path in write_outputs(args.output, outcome, _command_line()).items():
            print(f"wrote {what}: {path}")
    _print_summary(outcome.data)
    return 0


def eval_output_files(output: Path) -> tuple[Path, list[Path]]:
    """(<stem>.json, the other files `qcal eval -o` writes), named as qcal.eval.report does."""
    stem = Path(output)
    if stem.suffix in (".json", ".md"):
        stem = stem.with_suffix("")
    side = [stem.with_suffix(".md")] + [stem.with_name(stem.name + tail) for tail in
                                        ("_reliability.png", "_items.jsonl",
                                         "_token_nll.safetensors")]
    return stem.with_suffix(".json"), side


def check_eval_output(output: Path, overwrite: bool,
                      inputs: tuple[Path | str | None, ...] = ()) -> None:
    """`-o notes` replaces notes.json/notes.md only when qcal wrote them (else --overwrite),
    and never inside an `inputs` folder (the model evaluated, its base)."""
    from qcal.fsio import check_file_outputs

    main, side = eval_output_files(output)
    check_file_outputs(main, tuple(side), overwrite=overwrite, inputs=inputs)


def _print_summary(data: dict[str, Any]) -> None:
    ppl = data.get("perplexity")
    if ppl:
        has_base = bool(ppl.get("base"))
        print(f"{'lang':>6}  {'ppl':>10}  {'tokens':>8}" + ("  base ppl      KL mean" if has_base
                                                             else ""))
        for lang, row in ppl["model"].items():
            extra = ""
            if has_base:
                extra = (f"  {ppl['base'][lang]['ppl']:>8.3f}  "
                         f"{ppl['divergence'][lang]['kl_mean']:>11.5f}")
            print(f"{lang:>6}  {row['ppl']:>10.3f}  {row['tokens']:>8}{extra}")
    lm = data.get("lm_eval")
    if lm:
        for role, res in lm["results"].items():
            for task, m in res.items():
                acc, accn = m.get("acc,none"), m.get("acc_norm,none")
                print(f"{role:>6} {task}: acc {acc if acc is None else f'{acc:.4f}'}"
                      f"  acc_norm {accn if accn is None else f'{accn:.4f}'}")
    for task, per in (data.get("calibration") or {}).items():
        for role, kinds in per.items():
            m = kinds["raw"]
            print(f"{role:>6} {task}: ECE {m['ece']:.4f}  conf_true {m['conf_true']:.4f}  "
                  f"Brier {m['brier']:.4f}  NLL {m['nll']:.4f}")
    for task, kinds in (data.get("drift") or {}).items():
        d = kinds["raw"]
        print(f" drift {task}: d conf_true {d['delta_conf_true']:+.4f} "
              f"(p={d['ttest_conf_true'].get('p', float('nan')):.3g})  flip rate {d['flip_rate']:.3f}")


def parse_task_limits(values: list[str]) -> tuple[tuple[str, int], ...]:
    """`--task-limit mmlu=50` arguments as (task, n) pairs."""
    from qcal.errors import ConfigError

    out = []
    for text in values:
        task, sep, n = text.partition("=")
        if not sep or not task.strip() or not n.strip().isdigit():
            raise ConfigError(f"--task-limit {text!r}: write TASK=N, e.g. --task-limit mmlu=50")
        out.append((task.strip(), int(n)))
    return tuple(out)
