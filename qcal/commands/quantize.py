"""`qcal quantize`: RTN / GPTQ / AWQ into a GPTQ-layout checkpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from qcal.config import AWQConfig, GPTQConfig, QuantScheme, RTNConfig


def add_parser(sub: Any) -> None:
    p = sub.add_parser("quantize", help="quantize a HF model into a GPTQ-layout checkpoint")
    p.add_argument("--model", default=None, help="local HF model dir (default: embedded model)")
    p.add_argument("--method", default="rtn", help="rtn, gptq or awq")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=128, help="-1 for per-channel")
    p.add_argument("--sym", action="store_true", help="symmetric grid (default asymmetric)")
    p.add_argument("--strict-groups", action="store_true",
                   help="refuse group sizes that do not divide in_features (no ragged last group)")
    p.add_argument("--desc-act", action="store_true", help="GPTQ act-order")
    p.add_argument("--static-groups", action="store_true", help="GPTQ: precompute group grids")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ damp_percent")
    p.add_argument("--mse-clip", action="store_true", help="GPTQ: MSE clip search on the grid")
    p.add_argument("--no-clip", action="store_true", help="AWQ: skip the clip search")
    p.add_argument("--awq-artifact", type=Path, default=None,
                   help="AWQ: replay a saved search (<checkpoint>/artifacts/awq_search.safetensors) "
                        "instead of searching; needs no calibration data")
    p.add_argument("--calib", default="debian-handbook",
                   help="calibration set dir, packaged corpus name, text/JSONL file or hf:<name>")
    p.add_argument("--selector", default=None,
                   help="selector when --calib is a source (default random); GPTQ/AWQ only")
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--resume", action="store_true", help="continue after the last finished layer")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output that qcal did not write (or start over "
                        "instead of resuming); never the model directory or its parents")
    p.add_argument("--keep-work", action="store_true",
                   help="keep <output>.work (per-layer resume state) after a successful run")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model directory's own Python code to run (off by default)")
    p.add_argument("-o", "--output", type=Path, default=None, help="checkpoint directory")
    p.set_defaults(handler=run)


def make_config(args: argparse.Namespace) -> Any:
    scheme = QuantScheme(bits=args.bits, group_size=args.group_size, sym=args.sym,
                         strict_groups=args.strict_groups)
    if args.method == "gptq":
        return GPTQConfig(scheme=scheme, damp_percent=args.damp, desc_act=args.desc_act,
                          static_groups=args.static_groups, mse_clip=args.mse_clip)
    if args.method == "awq":
        return AWQConfig(scheme=scheme, clip_search=not args.no_clip)
    return RTNConfig(scheme=scheme)


def run(args: argparse.Namespace) -> int:
    from qcal.errors import ConfigError
    from qcal.methods import METHODS, RunOptions
    from qcal.model.loading import load_tokenizer, resolve_model_dir
    from qcal.pipeline import OutputPolicy, default_output_dir, guarded_output, quantize_model_dir

    if args.awq_artifact is not None:
        return _replay_awq(args)
    method = METHODS.get(args.method)
    if not method.needs_calibration and args.selector is not None:
        raise ConfigError(f"--selector chooses calibration data, which --method {args.method} "
                          "does not use; drop --selector or use --method gptq/awq")
    config = make_config(args)
    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    out = args.output or default_output_dir(args.model, args.method, config.scheme)
    policy = OutputPolicy(args.overwrite, args.resume, args.keep_work)
    expected = _expected_bytes(model_dir, method.needs_calibration)
    args.interrupt_hint = (f"{out}.work keeps the finished layers: run the same command with "
                           "--resume to continue") if method.needs_calibration else None
    with guarded_output(out, model_dir, policy, expected) as work:
        calib_ids, manifest = None, None
        if method.needs_calibration:
            from qcal.calib import resolve_calib

            tokenizer = load_tokenizer(model_dir, args.trust_remote_code)
            _warn_long_seqlen(model_dir, args.seqlen)
            calib = resolve_calib(args.calib, tokenizer, nsamples=args.nsamples,
                                  seqlen=args.seqlen, seed=args.seed,
                                  selector=args.selector or "random")
            calib_ids, manifest = calib.input_ids, calib.manifest
        opts = RunOptions(device=args.device, work_dir=work, resume=args.resume)
        log = quantize_model_dir(model_dir, args.method, config, out, calib_ids, manifest, opts,
                                 trust_remote_code=args.trust_remote_code)
    print(json.dumps({"output": str(out), "method": args.method,
                      "quantize_seconds": log["quantize_seconds"]}, indent=2))
    return 0


def _expected_bytes(model_dir: Path, calibrated: bool) -> int:
    """Disk the run needs: the checkpoint (at most the float files) plus, for layer-wise
    methods, per-layer resume state of about the same size."""
    floats = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    return floats * (2 if calibrated else 1)


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
    from qcal.pipeline import (
        OutputPolicy,
        default_output_dir,
        guarded_output,
        replay_awq_model_dir,
    )

    if args.method != "awq":
        raise ConfigError("--awq-artifact replays an AWQ search; use it with --method awq")
    # The artifact fixes bits/group/sym; name the default output after its scheme.
    scheme = from_dict(AWQConfig, load_artifact(args.awq_artifact)["config"]).scheme
    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    out = args.output or default_output_dir(args.model, "awq", scheme)
    policy = OutputPolicy(args.overwrite, False, False)
    with guarded_output(out, model_dir, policy, _expected_bytes(model_dir, False)):
        meta = replay_awq_model_dir(model_dir, args.awq_artifact, out, args.trust_remote_code)
    print(json.dumps({"output": str(out), "method": "awq", "awq_artifact": meta["awq_artifact"],
                      "quantize_seconds": meta["quantize_seconds"]}, indent=2))
    return 0
