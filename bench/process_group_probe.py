"""What a one-worker stage's process group costs, on NCCL and on gloo (issue 48): Ray Train makes an NCCL group on a
GPU, and accelerate's first barrier (TRL's dataset preparation, `main_process_first`) makes its communicator
(~4.5 s of a warm sft's first step on the H100, bench/results/startup_h100/). With one worker nothing is reduced, so
gloo would do if the collectives the trainer runs on CUDA tensors (accelerate's gather of the token count, a
broadcast, an all-reduce) work on it. One process per backend, world size 1:

    python3 bench/process_group_probe.py --out $OUT/process_group_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def probe(backend: str) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PROBE_PORT", "29533"))
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda")  # the CUDA context first: not the group's cost
    out: dict[str, object] = {"backend": backend}
    t = time.perf_counter()
    dist.init_process_group(backend, rank=0, world_size=1)
    out["init_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    dist.barrier()
    out["first_barrier_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    dist.barrier()
    out["second_barrier_s"] = round(time.perf_counter() - t, 4)
    x = torch.arange(4, device="cuda", dtype=torch.float32)
    for name, op in (("all_reduce", lambda: dist.all_reduce(x)), ("broadcast", lambda: dist.broadcast(x, 0)),
                     ("all_gather", lambda: dist.all_gather([torch.empty_like(x)], x)),
                     ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty_like(x), x))):
        try:
            t = time.perf_counter()
            op()
            torch.cuda.synchronize()
            out[name] = round(time.perf_counter() - t, 4)
        except Exception as e:  # the answer we are after: which collectives a backend refuses on CUDA tensors
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    dist.destroy_process_group()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--backend", help="probe this backend in this process (the driver runs one process each)")
    args = ap.parse_args()
    if args.backend:
        print(json.dumps(probe(args.backend)), flush=True)
        return 0
    results = []
    for i, backend in enumerate(("nccl", "gloo", "nccl")):  # nccl twice: the first may pay its library's load
        done = subprocess.run([sys.executable, __file__, "--backend", backend], capture_output=True, text=True,
                              env={**os.environ, "PROBE_PORT": str(29533 + i)}, timeout=300)
        lines = done.stdout.strip().splitlines()
        results.append(json.loads(lines[-1]) if done.returncode == 0 and lines else
                       {"backend": backend, "failed": done.stderr.strip().splitlines()[-1:]})
        print(results[-1], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
