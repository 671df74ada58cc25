"""`medgpt-ray topo`: GPU topology, the GPUs a job should use, and NCCL settings."""

from __future__ import annotations

import argparse
import sys


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

    from medgpt_ray.placement.nccl import nccl_env
    from medgpt_ray.placement.policy import PlacementError, choose_gpus, partition_gpus
    from medgpt_ray.placement.topology import NoGPUError, TopologyError, load_topology_file, read_local_topology

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
