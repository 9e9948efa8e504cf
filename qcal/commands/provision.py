"""`qcal provision`: fetch and build the offline models, corpora and benchmarks into
qcal's home ($QCAL_HOME or the current directory). Idempotent; `make setup` runs it.

The "model" part builds the default model and tries the optional second target
(Gemma-3-270M), whose failure is only a warning unless named with `--models`; the opt-in
Qwen2.5-Coder-1.5B-Instruct is built only when named."""

from __future__ import annotations

import argparse
from typing import Any

PARTS = ("model", "data", "benchmarks")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("provision", help="build the default model, corpora and benchmarks "
                                         "offline into qcal's home (idempotent)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated subset of {', '.join(PARTS)} (default: all)")
    p.add_argument("--models", "--model", dest="models", default=None,
                   help="comma-separated models for the model part: smollm2-135m-instruct "
                        "(default model), gemma-3-270m (optional), qwen2.5-coder-1.5b "
                        "(opt-in: built only when named) or all (default: all but the "
                        "opt-in ones)")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from qcal.errors import ConfigError

    # "models" is accepted for "model": the part builds more than one model now.
    wanted = [w.strip().replace("models", "model") for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        raise ConfigError(f"--only {unknown} unknown; choose from {', '.join(PARTS)}")
    if args.models is not None and "model" not in wanted:
        raise ConfigError("--models chooses what the model part builds; add model to --only")
    force = ["--force"] if args.force else []
    if "model" in wanted:
        from qcal.provision.model import main as provision_model

        provision_model(force + ([f"--models={args.models}"] if args.models else []))
    if "data" in wanted:
        from qcal.provision.data import main as provision_data

        rc = provision_data(force)
        if rc:
            return rc
    if "benchmarks" in wanted:
        from qcal.provision.benchmarks import main as provision_benchmarks

        provision_benchmarks(force)
    return 0
