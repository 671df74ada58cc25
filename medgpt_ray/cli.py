"""`medgpt-ray` command line: run (the pipeline), clean, estimate and plan (GPU memory), topo (placement)."""

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
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's own INFO log lines here (default: RUN_DIR/ray.log)")


def run_pipeline(args: argparse.Namespace) -> int:
    from medgpt_ray.pipeline import Pipeline, PipelineError, RunOptions, connect_ray

    try:
        cfg = load_config(args.config, args.sets, args.overrides)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return 2
    connected = connect_ray(args.num_cpus, log_file=Path(cfg.output_dir) / cfg.name / "ray.log",
                            verbose=args.verbose)
    print(f"medgpt-ray: run '{cfg.name}' on {connected} Ray ({args.config})", flush=True)
    try:
        Pipeline(cfg, RunOptions(from_stage=args.from_stage, only_stage=args.only_stage), connected).run()
    except (ConfigError, PipelineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def add_clean_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files or directories (.jsonl .json .csv .parquet .txt)")
    p.add_argument("--out", required=True, help="output directory: data/<kind>/, quarantine/, report.json")
    p.add_argument("--kind", default="auto", choices=["auto", "pretrain", "sft", "preference", "prompt"],
                   help="record kind; auto detects it per file and says what it found")
    p.add_argument("--config", default=None, help="cleaning YAML (normalize, pii, signoff, quality, dedup)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a cleaning option, e.g. --set dedup.threshold=0.9")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray cluster (default: all)")
    p.add_argument("--explain", type=int, default=0, metavar="N",
                   help="print up to N quarantined records per reason (PII-redacted; unparseable lines only as "
                        "file:line and reason)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's and the workers' own log lines here (default: OUT/clean.log)")


def run_clean(args: argparse.Namespace) -> int:
    from medgpt_ray.config import load_clean_config
    from medgpt_ray.data.clean import clean_corpus
    from medgpt_ray.data.explain import explain
    from medgpt_ray.data.readers import DataFileError
    from medgpt_ray.pipeline import connect_ray, echo

    try:
        cfg = load_clean_config(args.config, args.sets)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return 2
    if args.explain < 0:
        print("error: --explain N needs N >= 0", file=sys.stderr)
        return 2
    log_file = Path(args.out) / "clean.log"
    connect_ray(args.num_cpus, log_file=log_file, verbose=args.verbose, worker_logs=args.verbose)
    if not args.verbose:
        echo(f"[clean] Ray's own logs: {log_file.resolve()} (--verbose shows them here)")
    try:
        report = clean_corpus(args.inputs, args.out, args.kind, cfg, echo=echo)
    except DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.explain:
        for line in explain(Path(args.out) / "quarantine", args.explain):
            echo(line)
    return 0 if report["adds_up"] else 1


def add_topo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology-file", default=None, metavar="F",
                   help="saved `nvidia-smi topo -m` output, or a shipped name (cluster/topologies/); "
                        "default: this machine")
    p.add_argument("--gpus", default=None, metavar="K[,K2,...]",
                   help="GPUs for one job, or sizes of concurrent jobs (default: every GPU, one job)")
    p.add_argument("--p2p", choices=["on", "off"], default=None, help="override peer-to-peer support")
    p.add_argument("--json", action="store_true")


def run_topo(args: argparse.Namespace) -> int:
    import json

    from medgpt_ray.placement import PlacementError, choose_gpus, nccl_env, partition_gpus
    from medgpt_ray.topology import NoGPUError, TopologyError, load_topology_file, read_local_topology

    try:
        topo = load_topology_file(args.topology_file) if args.topology_file else read_local_topology()
    except NoGPUError as e:
        print(f"medgpt-ray topo: {e}", file=sys.stderr)
        return 1
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.p2p is not None:
        topo.p2p = args.p2p == "on"
    try:
        sizes = [int(x) for x in args.gpus.split(",")] if args.gpus else [topo.n]
    except ValueError:
        print(f"error: --gpus {args.gpus!r}: comma-separated GPU counts, e.g. 4 or 4,4", file=sys.stderr)
        return 2
    env = nccl_env(topo)
    try:
        if len(sizes) == 1:
            choice = choose_gpus(topo, sizes[0])
            out = {"gpus": choice.gpus, "cost": round(choice.cost, 4), "runner_up": choice.runner_up,
                   "runner_up_cost": None if choice.runner_up_cost is None else round(choice.runner_up_cost, 4),
                   "why": choice.why, "nccl_env": env}
        else:
            jobs, cost = partition_gpus(topo, sizes)
            out = {"jobs": jobs, "cost": round(cost, 4), "nccl_env": env}
    except PlacementError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.update({"topology": topo.source, "gpu_name": topo.gpu_name, "p2p": topo.p2p_available(),
                "bus_ids": topo.bus_ids})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{topo.source}: {topo.n} x {topo.gpu_name}, peer-to-peer {'on' if topo.p2p_available() else 'off'}")
    print(topo.matrix_text())
    if "gpus" in out:
        print(f"choice for {sizes[0]} GPU(s): {out['gpus']} (cost {out['cost']})")
        for line in out["why"]:
            print(f"  {line}")
        if out["runner_up"] is not None:
            print(f"runner-up: {out['runner_up']} (cost {out['runner_up_cost']})")
    else:
        print(f"concurrent jobs of {args.gpus} GPUs: {out['jobs']} (summed cost {out['cost']})")
    print("NCCL/CUDA environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    return 0


def add_tune_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p)
    p.add_argument("--sweep", required=True, help="sweep YAML: stage, metric, mode, space, searcher, num_samples")
    p.add_argument("--dry-run", action="store_true", help="plan the trials and say which would be pruned; run none")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep (finished trials are kept)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray cluster (default: all)")


def run_tune(args: argparse.Namespace) -> int:
    from medgpt_ray.pipeline import connect_ray, echo
    from medgpt_ray.tune_run import run_sweep

    try:
        if not args.dry_run:
            connect_ray(args.num_cpus)
        run_sweep(args.config, args.sets, args.sweep, echo=echo, dry_run=args.dry_run, resume=args.resume)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medgpt-ray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_args(sub.add_parser("run", help="run the pipeline (pt -> sft -> rm, dpo)"))
    add_clean_args(sub.add_parser("clean", help="clean a raw corpus with Ray Data"))
    from medgpt_ray.memory import report

    report.add_estimate_args(sub.add_parser("estimate", help="predict one training setup's peak GPU memory"))
    report.add_plan_args(sub.add_parser("plan", help="plan every stage of a config to fit the GPU memory"))
    add_topo_args(sub.add_parser("topo", help="GPU topology, the GPUs a job should use, and NCCL settings"))
    add_tune_args(sub.add_parser("tune", help="a Ray Tune sweep over one stage, planned before any trial runs"))
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_pipeline(args)
    if args.command == "clean":
        return run_clean(args)
    if args.command == "estimate":
        return report.run_estimate(args)
    if args.command == "plan":
        return report.run_plan(args)
    if args.command == "topo":
        return run_topo(args)
    if args.command == "tune":
        return run_tune(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
