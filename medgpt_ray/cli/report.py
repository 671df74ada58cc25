"""`medgpt-ray report RUN_DIR [--out FILE.html]`: a run's self-contained HTML report (the pipeline also writes it,
as runs/<name>/report.html, at the end of every run)."""

from __future__ import annotations

import argparse
import sys


def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run's directory, e.g. runs/tiny-cpu")
    p.add_argument("--out", default=None, metavar="FILE.html", help="where to write it (default: RUN_DIR/report.html)")


def run_report(args: argparse.Namespace) -> int:
    from medgpt_ray.report import write_report

    try:
        path = write_report(args.run_dir, args.out)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
