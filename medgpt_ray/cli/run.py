"""`medgpt-ray run`: the pipeline. Also the `--config/--set/--overrides` arguments every config command shares."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from medgpt_ray.cli.args import config_error, positive_int
from medgpt_ray.config import STAGE_KINDS, ConfigError, load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"
# What `medgpt-ray run --help` and `python jobs/pipeline.py --help` say the command does.
RUN_HELP = "run the config's enabled stages in order (pt, sft, rm, dpo, grpo, ...; data cleaned first)"


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="pipeline YAML (default: configs/tiny-cpu.yaml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set stages.sft.lr=1e-4 (repeatable)")
    p.add_argument("--overrides", default=None, metavar="FILE", help="YAML of dotted keys (what a Tune sweep writes)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-stage", choices=list(STAGE_KINDS), help="rerun this stage and everything downstream")
    g.add_argument("--only-stage", choices=list(STAGE_KINDS),
                   help="rerun this stage alone (its upstream must be finished)")
    p.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's own INFO log lines here (default: RUN_DIR/ray.log)")


def _checked_config(args: argparse.Namespace):
    """The config, checked before Ray starts (the paths, the CPUs); an int is the rc of a mistake already said."""
    from medgpt_ray.run.preflight import check_cpus, check_paths, check_writable
    from medgpt_ray.run.upstream import PipelineError, check_only_stage

    try:
        cfg = load_config(args.config, args.sets, args.overrides)
        if args.only_stage:
            check_only_stage(cfg, args.only_stage)
        check_paths(cfg)
        check_writable(Path(cfg.output_dir) / cfg.name)
        if not os.environ.get("RAY_ADDRESS"):  # a local cluster: its CPUs are known before it starts
            check_cpus(cfg, args.num_cpus or os.cpu_count() or 1, "this machine" if args.num_cpus is None
                       else f"--num-cpus {args.num_cpus}")
    except ConfigError as e:
        return config_error(e)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return cfg


def run_pipeline(args: argparse.Namespace) -> int:
    # The checks before Ray starts need none of the pipeline's imports (torch, transformers, Ray Train: ~7 s on a
    # 2-core box): a mistake is said in a second; the pipeline module is imported once they pass.
    from medgpt_ray.run.run_lock import RunDirBusy, run_dir_lock

    cfg = _checked_config(args)
    if isinstance(cfg, int):
        return cfg
    run_dir = Path(cfg.output_dir) / cfg.name
    held = ExitStack()
    try:  # before Ray writes its log there: a second run of this name must not touch the directory
        held.enter_context(run_dir_lock(run_dir, echo=lambda line: print(line, flush=True)))
    except RunDirBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # making the run directory or its lock file: the output_dir is not writable here
        return config_error(ConfigError(f"output_dir: cannot write the run directory {run_dir} "
                                        f"({e.strerror or e}); set output_dir to a directory you can write"))
    with held:
        return _run_locked(args, cfg)


def _run_locked(args: argparse.Namespace, cfg) -> int:
    from medgpt_ray.run.pipeline import Pipeline, RunOptions
    from medgpt_ray.run.ray_env import connect_ray
    from medgpt_ray.run.upstream import PipelineError

    log_file = Path(cfg.output_dir) / cfg.name / "ray.log"
    # The workers' own output (library warnings, Ray Train's per-rank lines) stays in Ray's session logs: the
    # progress lines reach the driver through the progress actor, and a failure through the stage's error.
    connected = connect_ray(args.num_cpus, log_file=log_file, verbose=args.verbose, worker_logs=args.verbose)
    print(f"medgpt-ray: run '{cfg.name}' on {connected} Ray ({args.config})", flush=True)
    if not args.verbose:
        tmp = os.environ.get("RAY_TMPDIR", "/tmp/ray")
        print(f"medgpt-ray: Ray's own log lines: {log_file.resolve()}; the workers' output: Ray's session logs "
              f"(`ray logs`; {tmp}/session_latest/logs on a local run); --verbose shows both here", flush=True)
    try:
        Pipeline(cfg, RunOptions(from_stage=args.from_stage, only_stage=args.only_stage), connected).run()
    except ConfigError as e:  # found once Ray is up: a data file with no usable record, a relative output_dir
        return config_error(e)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: finished stages and the last checkpoint are kept; re-run the same command to resume",
              file=sys.stderr)
        return 130
    return 0
