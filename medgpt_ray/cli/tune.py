"""`medgpt-ray tune`: a Ray Tune sweep over one stage."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from medgpt_ray.cli.args import config_error, positive_int
from medgpt_ray.cli.run import add_config_args
from medgpt_ray.config import ConfigError


def add_tune_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--sweep", required=True, help="sweep YAML: stage, metric, mode, space, searcher, num_samples")
    p.add_argument("--dry-run", action="store_true", help="plan the trials and say which would be pruned; run none")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep (finished trials are kept)")
    p.add_argument("--from-run", default=None, metavar="RUN",
                   help="a finished pipeline run (runs/<name>, with its manifest.json): the trials start from its "
                        "output of the stage the swept one starts from, and read the stages it needs from it")
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's, Tune's and the workers' own log lines here (default: RUN_DIR/tune-ray.log)")


def run_tune(args: argparse.Namespace) -> int:
    from medgpt_ray.config import PipelineConfig
    from medgpt_ray.run.preflight import check_paths
    from medgpt_ray.run.ray_env import connect_ray, echo
    from medgpt_ray.tune.driver import run_sweep

    def connect(cfg: PipelineConfig) -> None:
        # Once the config, the sweep file and --from-run's manifest are checked; a missing model or data file
        # too, before Ray starts. A dry run reads neither and never gets here: it plans from model.shape where
        # the model directory is not on this machine, as `plan` does.
        check_paths(cfg)
        log_file = Path(cfg.output_dir) / cfg.name / "tune-ray.log"
        # Tune's and Ray Train's per-trial, per-rank lines ("Reporting training result", placement-group
        # cleanup) would drown the sweep's own lines: they go to the file unless --verbose.
        connect_ray(args.num_cpus, log_file=log_file, verbose=args.verbose, worker_logs=args.verbose)
        if not args.verbose:
            echo(f"[tune] Ray's and the trials' own log lines: {log_file.resolve()} (--verbose shows them here)")
            # Tune's console reporter (the experiment table, status tables) and Optuna's INFO lines: the
            # sweep prints its own line per trial and the summary.
            os.environ.setdefault("AIR_VERBOSITY", "0")
            logging.getLogger("optuna").setLevel(logging.WARNING)

    try:
        run_sweep(args.config, args.sets, args.sweep, echo=echo, dry_run=args.dry_run, resume=args.resume,
                  overrides=args.overrides, from_run=args.from_run, before_ray=connect)
    except ConfigError as e:
        return config_error(e)
    return 0
