"""`qcal quantize`: a registered method (RTN, RTN-MSE, GPTQ, AWQ) into a checkpoint; each
method's own flags come from its entry in the method registry."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path
from typing import Any

from qcal.commands import add_text_options
from qcal.config import AWQConfig, ModuleSelection, QuantScheme, parse_scheme_override


def add_parser(sub: Any) -> None:
    p = sub.add_parser("quantize", help="quantize a HF model into a GPTQ-layout checkpoint")
    p.add_argument("--model", default=None, help="local HF model dir (default: embedded model)")
    from qcal.methods import METHODS, all_methods

    p.add_argument("--method", default="rtn", choices=METHODS.names(),
                   help="quantization method")
    p.add_argument("--bits", type=int, default=4,
                   help="bits per weight: 2, 3, 4 or 8 (what a checkpoint can pack; awq format: "
                        "4; 3 bits need in/out_features divisible by 32); default 4")
    p.add_argument("--group-size", default="auto",
                   help="weights per scale along in_features; -1 per channel; default auto: the "
                        "largest of 128/64/32 that divides every quantized in_features")
    p.add_argument("--sym", action="store_true", help="symmetric grid (default asymmetric)")
    p.add_argument("--allow-ragged-groups", action="store_true",
                   help="accept a group size that does not divide in_features (smaller last group; "
                        "GPTQ layout only, not for Marlin, the CPU int4 op, compressed-tensors, AWQ)")
    p.add_argument("--strict-groups", action="store_true",
                   help=argparse.SUPPRESS)  # the default now; kept so old commands still run
    added: set[str] = set()
    for method in all_methods():  # each method's own flags, declared in its file
        for flag in method.flags:
            if flag.dest in added:  # a flag two methods share (RTN-MSE's search settings)
                continue
            added.add(flag.dest)
            if flag.value_type is None:
                p.add_argument(flag.option, action="store_true", help=flag.help)
            else:
                p.add_argument(flag.option, type=flag.value_type, default=flag.default,
                               help=flag.help)
    p.add_argument("--awq-artifact", type=Path, default=None,
                   help="AWQ: replay a saved search (<checkpoint>/artifacts/awq_search.safetensors) "
                        "instead of searching; needs no calibration data")
    p.add_argument("--calib", default="debian-handbook",
                   help="calibration set dir, packaged corpus name, .txt/.jsonl/.parquet file, "
                        "dataset folder (save_to_disk or data files) or hf:<name>")
    add_text_options(p)
    p.add_argument("--selector", default=None,
                   help="selector when --calib is a source (default random); self[:...] has the "
                        "model write its own calibration text; calibrated methods only")
    p.add_argument("--nsamples", type=int, default=128, help="calibration windows (>= 1)")
    p.add_argument("--seqlen", type=int, default=512,
                   help="tokens per calibration (and --eval) window (>= 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration draw (>= 0)")
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N or auto (default: CUDA when present); layers visit it "
                        "one at a time")
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel calibration in N processes (runs itself under torchrun: "
                        "gloo on CPU, nccl on GPUs); GPTQ, AWQ and RTN")
    p.add_argument("--resume", action="store_true", help="continue after the last finished layer")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output that qcal did not write (or start over "
                        "instead of resuming); never the model directory or its parents")
    p.add_argument("--keep-work", action="store_true",
                   help="keep <output>.work (per-layer resume state) after a successful run")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model directory's own Python code to run (off by default)")
    p.add_argument("--format", default="compressed-tensors",
                   choices=("compressed-tensors", "gptq", "gptq_v2", "awq"),
                   help="checkpoint format: compressed-tensors (default: pack-quantized, loads in "
                        "bare transformers, lm_eval and vLLM), gptq (needs GPTQModel/optimum in "
                        "transformers), gptq_v2 (true zero points: what GPTQModel needs for "
                        "asymmetric schemes) or awq (AutoAWQ GEMM layout, 4-bit, no act-order)")
    p.add_argument("--targets", action="append", default=[], metavar="REGEX",
                   help="quantize only the decoder-layer linears whose full name matches "
                        "(re.search; repeatable; default: all)")
    p.add_argument("--ignore", action="append", default=[], metavar="REGEX",
                   help="keep the matching linears float, e.g. 'layers\\.0\\.' (repeatable)")
    p.add_argument("--moe-all-experts", action="store_true",
                   help="MoE: every calibration token also reaches every expert (outputs "
                        "discarded), so no expert goes without calibration data")
    p.add_argument("--scheme-override", action="append", default=[],
                   metavar="REGEX=bits:B,group:G[,sym:true|false]",
                   help="per-module scheme: linears whose full name matches REGEX (re.match from "
                        "the start, e.g. '.*down_proj') take these fields instead of --bits/"
                        "--group-size/--sym; REGEX=skip keeps them float; repeatable, the first "
                        "match wins (like GPTQModel's dynamic); default: none")
    p.add_argument("--rotate", default=None, metavar="hadamard[:SEED]",
                   help="fold a seeded randomized Hadamard rotation of the residual stream into "
                        "the float weights before the method runs (exact; RMSNorm models "
                        "without post-norms; the output loads anywhere); default: none")
    p.add_argument("--show-arch", action="store_true",
                   help="print the architecture qcal resolves for the model (layers, linears, "
                        "steps, AWQ scale groups) and exit without quantizing")
    p.add_argument("--eval", action="store_true",
                   help="afterwards, print float vs quantized perplexity on held-out text")
    p.add_argument("--eval-langs", default="en", help="with --eval: languages (e.g. en,de)")
    p.add_argument("--eval-windows", type=int, default=16,
                   help="with --eval: windows of --seqlen tokens per language")
    p.add_argument("-o", "--output", type=Path, default=None, help="checkpoint directory")
    p.add_argument("--shard-size", default="2GB",
                   help="largest checkpoint shard (e.g. 500MB, 2GB); a bigger checkpoint is "
                        "written as model-0000i-of-0000N.safetensors plus the standard index")
    p.add_argument("--max-memory", default="auto",
                   help="calibration activations kept in RAM between layers (e.g. 4GB); above "
                        "it they spill to <output>.work; auto: a quarter of the available RAM")
    p.set_defaults(handler=run)


def make_config(args: argparse.Namespace) -> Any:
    from qcal.errors import ConfigError
    from qcal.methods import all_methods
    from qcal.recipe import method_config

    scheme = QuantScheme(bits=args.bits, group_size=_group_size(args), sym=args.sym,
                         allow_ragged=args.allow_ragged_groups)
    # A method's flag left at its default leaves the config's default; one given for another
    # method is an error rather than silently ignored.
    options: dict[str, Any] = {}
    owners: dict[str, list[str]] = {}
    for method in all_methods():
        for flag in method.flags:
            owners.setdefault(flag.dest, []).append(method.name)
    for method in all_methods():
        for flag in method.flags:
            value = getattr(args, flag.dest)
            if value == flag.default:
                continue
            if args.method not in owners[flag.dest]:
                names = "/".join(owners[flag.dest])
                raise ConfigError(f"{flag.option} is a {names} option; drop it or use "
                                  f"--method {owners[flag.dest][0]}")
            if method.name == args.method:
                options[flag.field] = flag.config_value(value)
    return method_config(args.method, scheme, **options)


def _group_size(args: argparse.Namespace) -> int:
    """--group-size as an int; `auto` resolved against the model (and said on stderr)."""
    import sys

    from qcal.errors import ConfigError

    if str(args.group_size) != "auto":
        try:
            return int(args.group_size)
        except ValueError:
            raise ConfigError(f"--group-size {args.group_size!r} is not a number; give e.g. 64, "
                              "-1 (per channel) or auto") from None
    from qcal.model.loading import resolve_model_dir
    from qcal.model.shapes import default_group_size

    if getattr(args, "resolved_group", None) is None:
        group, why = default_group_size(resolve_model_dir(args.model, args.trust_remote_code),
                                        args.trust_remote_code)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"qcal quantize: {why}", file=sys.stderr)
        args.resolved_group, args.group_choice = group, why
    return args.resolved_group


def make_recipe(args: argparse.Namespace) -> Any:
    """The command line as a QuantRecipe (the one currency from CLI to checkpoint)."""
    from qcal.errors import ConfigError
    from qcal.methods import METHODS, all_methods
    from qcal.recipe import QuantRecipe
    from qcal.run_config import CalibConfig, EvalConfig, Rotation

    method = METHODS.get(args.method)
    if not method.needs_calibration and args.selector is not None:
        calibrated = "/".join(m.name for m in all_methods() if m.needs_calibration)
        raise ConfigError(f"--selector chooses calibration data, which --method {args.method} "
                          f"does not use; drop --selector or use --method {calibrated}")
    calib = (CalibConfig(selector=args.selector or "random", source=args.calib,
                         nsamples=args.nsamples, seqlen=args.seqlen, seed=args.seed,
                         text_field=args.text_field, chat=args.chat)
             if method.needs_calibration else None)
    evaluation = None
    if args.eval:
        langs = tuple(x.strip() for x in args.eval_langs.split(",") if x.strip())
        evaluation = EvalConfig(langs=langs, max_windows=args.eval_windows, seqlen=args.seqlen)
    modules = ModuleSelection(tuple(args.targets), tuple(args.ignore), args.moe_all_experts,
                              tuple(map(parse_scheme_override, args.scheme_override)))
    return QuantRecipe(method=make_config(args), calib=calib, model=args.model, modules=modules,
                       output=str(args.output) if args.output else None, device=args.device,
                       trust_remote_code=args.trust_remote_code, eval=evaluation,
                       format=args.format, command=getattr(args, "command_line", None),
                       notes=tuple(n for n in [getattr(args, "group_choice", None)] if n),
                       rotation=Rotation.parse(args.rotate) if args.rotate else None)


def run(args: argparse.Namespace) -> int:
    from qcal.model.consistency import refuse_quantized_source
    from qcal.model.loading import resolve_model_dir
    from qcal.output import OutputPolicy
    from qcal.run import run_recipe

    if args.show_arch:
        return _show_arch(args)
    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    refuse_quantized_source(model_dir)
    if args.awq_artifact is not None:
        return _replay_awq(args)
    if args.nproc > 1:
        return _launch_torchrun(args)
    recipe = make_recipe(args)
    if recipe.uses_calibration():
        _warn_long_seqlen(model_dir, args.seqlen)
    from qcal.output import default_output_dir

    out = args.output or default_output_dir(args.model, recipe.method_name, recipe.scheme)
    args.interrupt_hint = (f"{out}.work keeps the finished layers: run the same command "
                           "with --resume to continue")
    from qcal.model.stream import parse_bytes

    outcome = run_recipe(recipe, policy=OutputPolicy(args.overwrite, args.resume, args.keep_work),
                         shard_bytes=parse_bytes(args.shard_size, "--shard-size"),
                         max_memory=(None if args.max_memory == "auto"
                                     else parse_bytes(args.max_memory, "--max-memory")))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 reports
    summary: dict[str, Any] = {"output": str(outcome.output), "method": recipe.method_name,
                               "quantize_seconds": outcome.log["quantize_seconds"]}
    if outcome.evaluation is not None:
        summary["perplexity"] = _float_vs_quantized(outcome, recipe)
        _card_with_evaluation(outcome, recipe, summary)
    print(json.dumps(summary, indent=2))
    return 0


def _show_arch(args: argparse.Namespace) -> int:
    """The resolved ArchSpec of the model, from its config alone (no weights are read)."""
    from qcal.model.loading import resolve_model_dir
    from qcal.model.resolve import resolve_arch
    from qcal.model.shapes import skeleton

    spec = resolve_arch(skeleton(resolve_model_dir(args.model, args.trust_remote_code),
                                 args.trust_remote_code))
    print(spec.describe())
    return 0


def _float_vs_quantized(outcome: Any, recipe: Any) -> dict[str, Any]:
    """Perplexity of the checkpoint next to the float model's on the same windows."""
    import dataclasses

    from qcal.eval.job import run_evaluation

    base = run_evaluation(recipe.model, dataclasses.replace(recipe.eval), progress=False,
                          device=recipe.device, trust_remote_code=recipe.trust_remote_code)
    quant = outcome.evaluation.data["perplexity"]["model"]
    table = {}
    for lang, row in quant.items():
        ref = base.data["perplexity"]["model"][lang]
        table[lang] = {"float": round(ref["ppl"], 3), "quantized": round(row["ppl"], 3),
                       "tokens": row["tokens"], "windows": row["windows"]}
    return table


def _launch_torchrun(args: argparse.Namespace) -> int:
    """`qcal quantize --nproc N ...` = `torchrun --standalone --nproc_per_node N -m qcal
    quantize ...` (the same arguments, without --nproc)."""
    import sys

    from qcal.errors import ConfigError
    from qcal.processes import run_process_group

    if os.environ.get("WORLD_SIZE"):
        raise ConfigError("--nproc inside torchrun would launch torchrun again; drop --nproc")
    argv = shlex.split(getattr(args, "command_line", ""))[1:]
    rest, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token == "--nproc":
            skip = True
            continue
        if token.startswith("--nproc="):
            continue
        rest.append(token)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}", "-m", "qcal", *rest]
    return run_process_group(cmd)  # a signal to qcal stops torchrun and every worker


def _card_with_evaluation(outcome: Any, recipe: Any, summary: dict[str, Any]) -> None:
    """Rewrite the checkpoint's model card with the evaluation that just ran."""
    from qcal.fsio import atomic_write_text
    from qcal.packing.card import model_card

    card = model_card(outcome.log, recipe.format, str(outcome.log.get("source_model")),
                      recipe.command, {"perplexity": summary["perplexity"]})
    atomic_write_text(Path(outcome.output) / "README.md", card)


def _warn_long_seqlen(model_dir: Path, seqlen: int) -> None:
    import sys

    from qcal.model.loading import read_model_config

    limit = read_model_config(model_dir).get("max_position_embeddings")
    if isinstance(limit, int) and seqlen > limit:
        print(f"qcal quantize: warning: --seqlen {seqlen} exceeds the model's "
              f"max_position_embeddings={limit}; positions past it are out of distribution",
              file=sys.stderr)


def _replay_awq(args: argparse.Namespace) -> int:
    from qcal.config import from_dict
    from qcal.errors import ConfigError
    from qcal.methods.awq_runner import load_artifact
    from qcal.model.loading import resolve_model_dir
    from qcal.output import OutputPolicy, default_output_dir, guarded_output
    from qcal.run import replay_awq_model_dir

    if args.method != "awq":
        raise ConfigError("--awq-artifact replays an AWQ search; use it with --method awq")
    # The artifact fixes bits/group/sym; name the default output after its scheme.
    scheme = from_dict(AWQConfig, load_artifact(args.awq_artifact)["config"]).scheme
    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    out = args.output or default_output_dir(args.model, "awq", scheme)
    policy = OutputPolicy(args.overwrite, False, False)
    floats = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    with guarded_output(out, model_dir, policy, floats):
        meta = replay_awq_model_dir(model_dir, args.awq_artifact, out, args.trust_remote_code,
                                    fmt=args.format, command=getattr(args, "command_line", None))
    print(json.dumps({"output": str(out), "method": "awq", "awq_artifact": meta["awq_artifact"],
                      "quantize_seconds": meta["quantize_seconds"]}, indent=2))
    return 0
