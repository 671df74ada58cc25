"""`medgpt-ray clean`: clean a raw corpus with Ray Data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medgpt_ray.cli.args import config_error, non_negative_int, positive_int
from medgpt_ray.config import ConfigError
from medgpt_ray.data.kinds import CLEANED_KINDS


def add_clean_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files or directories (.jsonl .json .csv .parquet .txt)")
    p.add_argument("--out", required=True, help="output directory: data/<kind>/, quarantine/, report.json")
    p.add_argument("--kind", default="auto", choices=["auto", *CLEANED_KINDS],
                   help="record kind; auto detects it per file and says what it found")
    p.add_argument("--config", default=None, help="cleaning YAML (normalize, pii, signoff, quality, dedup)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a cleaning option, e.g. --set dedup.threshold=0.9")
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--explain", type=non_negative_int, default=0, metavar="N",
                   help="print up to N quarantined records per reason (PII-redacted; unparseable lines only as "
                        "file:line and reason)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace data/, quarantine/ and _work/ in an --out directory that medgpt-ray clean did not "
                        "write (refused without it when the directory is not empty)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's and the workers' own log lines here (default: OUT/clean.log)")


def run_clean(args: argparse.Namespace) -> int:
    from medgpt_ray.config import load_clean_config
    from medgpt_ray.data.kinds import DataFileError
    from medgpt_ray.data.output_dir import claim_output_dir

    try:
        cfg = load_clean_config(args.config, args.sets)
    except ConfigError as e:
        return config_error(e)
    try:  # before Ray writes its log there: whose directory --out is decides whether we may write at all
        claim_output_dir(args.out, args.inputs, args.overwrite)
    except DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _clean(args, cfg)


INTERRUPTED = ".medgpt-clean-interrupted"  # in --out: the last run there was cut short (Ctrl-C)


def _clean(args: argparse.Namespace, cfg) -> int:
    from medgpt_ray.data.explain import explain
    from medgpt_ray.data.kinds import DataFileError
    from medgpt_ray.run.ray_env import echo

    out = Path(args.out)
    log_file = out / "clean.log"
    try:  # from the first import of Ray on: a Ctrl-C anywhere here is the sentence below
        from medgpt_ray.data.clean import clean_corpus
        from medgpt_ray.run.progress import LiveProgress
        from medgpt_ray.run.ray_env import connect_ray

        connect_ray(args.num_cpus, log_file=log_file, verbose=args.verbose, worker_logs=args.verbose)
        if not args.verbose:
            echo(f"[clean] Ray's own logs: {log_file.resolve()} (--verbose shows them here)")
        if (out / INTERRUPTED).is_file():
            echo(f"[clean] the last run into {out} was interrupted: starting over from the first chunk (the cleaner "
                 "does not resume part-way)")
        report = clean_corpus(args.inputs, args.out, args.kind, cfg, echo=echo, live_progress=LiveProgress,
                              overwrite=args.overwrite)
    except DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        (out / INTERRUPTED).touch()
        print(f"interrupted: the cleaning into {out} stopped before its end and left no partial output (data/, "
              "quarantine/ and the work files are removed); re-run the same command to clean from the start",
              file=sys.stderr)
        return 130
    (out / INTERRUPTED).unlink(missing_ok=True)
    if args.explain:
        for line in explain(out / "quarantine", args.explain):
            echo(line)
    return 0 if report["adds_up"] else 1
