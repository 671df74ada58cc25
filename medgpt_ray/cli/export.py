"""`medgpt-ray export`: a finished stage of a run as a clean model directory with its model card."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<name>)")
    p.add_argument("--stage", required=True, help="the finished stage to export (e.g. dpo)")
    p.add_argument("--out", required=True, help="the model directory to write (new or empty)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="weights' dtype (default bf16)")
    p.add_argument("--overwrite", action="store_true", help="write into a directory that is not empty")


def run_export(args: argparse.Namespace) -> int:
    from medgpt_ray.run.export import ExportError, export_stage

    try:
        export_stage(Path(args.run_dir), args.stage, Path(args.out), args.dtype, args.overwrite)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
