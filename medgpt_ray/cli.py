"""`medgpt-ray` command line: run (the pipeline), clean, estimate and plan (GPU memory)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medgpt_ray.config import STAGES, ConfigError, load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml"


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="pipeline YAML (default: configs/tiny-cpu.yaml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set stages.sft.lr=1e-4 (repeatable)")
    p.add_argument("--overrides", default=None, metavar="FILE", help="YAML of dotted keys (what a Tune sweep writes)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-stage", choices=STAGES, help="rerun this stage and everything downstream")
    g.add_argument("--only-stage", choices=STAGES, help="rerun this stage alone (its upstream must be finished)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray cluster (default: all)")


def run_pipeline(args: argparse.Namespace) -> int:
    from medgpt_ray.pipeline import Pipeline, PipelineError, RunOptions, connect_ray

    try:
        cfg = load_config(args.config, args.sets, args.overrides)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return 2
    connected = connect_ray(args.num_cpus)
    print(f"medgpt-ray: run '{cfg.name}' on {connected} Ray ({args.config})", flush=True)
    try:
        Pipeline(cfg, RunOptions(from_stage=args.from_stage, only_stage=args.only_stage), connected).run()
    except (ConfigError, PipelineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def add_clean_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or directories (.jsonl .json .csv .parquet)")
    p.add_argument("--out", required=True, help="output directory: data/<kind>/, quarantine/, report.json")
    p.add_argument("--kind", default="auto", choices=["auto", "pretrain", "sft", "preference"],
                   help="record kind; auto detects it per file and says what it found")
    p.add_argument("--config", default=None, help="cleaning YAML (normalize, pii, signoff, quality, dedup)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a cleaning option, e.g. --set dedup.threshold=0.9")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray cluster (default: all)")


def run_clean(args: argparse.Namespace) -> int:
    from medgpt_ray.config import load_clean_config
    from medgpt_ray.data.clean import clean_corpus
    from medgpt_ray.data.readers import DataFileError
    from medgpt_ray.pipeline import connect_ray, echo

    try:
        cfg = load_clean_config(args.config, args.sets)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return 2
    connect_ray(args.num_cpus)
    try:
        report = clean_corpus(args.inputs, args.out, args.kind, cfg, echo=echo)
    except DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0 if report["adds_up"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medgpt-ray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_args(sub.add_parser("run", help="run the pipeline (pt -> sft -> rm, dpo)"))
    add_clean_args(sub.add_parser("clean", help="clean a raw corpus with Ray Data"))
    from medgpt_ray.memory import report

    report.add_estimate_args(sub.add_parser("estimate", help="predict one training setup's peak GPU memory"))
    report.add_plan_args(sub.add_parser("plan", help="plan every stage of a config to fit the GPU memory"))
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_pipeline(args)
    if args.command == "clean":
        return run_clean(args)
    if args.command == "estimate":
        return report.run_estimate(args)
    if args.command == "plan":
        return report.run_plan(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
