"""`qcal export`: rewrite a quantized checkpoint in another format."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="convert a quantized checkpoint to another format",
                       description="Read a checkpoint in any format qcal reads (GPTQ layout, "
                                   "compressed-tensors pack-quantized, AWQ GEMM) and write it in "
                                   "--format, with a model card.")
    p.add_argument("--model", required=True, help="the quantized checkpoint to convert")
    p.add_argument("--format", required=True, choices=("gptq", "gptq_v2", "compressed-tensors", "awq"),
                   help="checkpoint format to write")
    p.add_argument("-o", "--output", type=Path, required=True, help="new checkpoint directory")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output that qcal did not write")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from qcal.export import export_checkpoint
    from qcal.output import OutputPolicy

    out = export_checkpoint(args.model, args.output, args.format, OutputPolicy(args.overwrite),
                            command=getattr(args, "command_line", None))
    print(f"wrote {args.format} checkpoint: {out}")
    return 0
