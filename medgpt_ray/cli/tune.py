"""`medgpt-ray tune`: a Ray Tune sweep over one stage."""

from __future__ import annotations

import argparse

from medgpt_ray.cli.args import config_error, positive_int
from medgpt_ray.cli.run import add_config_args
from medgpt_ray.config import ConfigError


def add_tune_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--sweep", required=True, help="sweep YAML: stage, metric, mode, space, searcher, num_samples")
    p.add_argument("--dry-run", action="store_true", help="plan the trials and say which would be pruned; run none")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep (finished trials are kept)")
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")


def run_tune(args: argparse.Namespace) -> int:
    from medgpt_ray.run.ray_env import connect_ray, echo
    from medgpt_ray.tune.driver import run_sweep

    try:
        if not args.dry_run:
            connect_ray(args.num_cpus)
        run_sweep(args.config, args.sets, args.sweep, echo=echo, dry_run=args.dry_run, resume=args.resume)
    except ConfigError as e:
        return config_error(e)
    return 0
