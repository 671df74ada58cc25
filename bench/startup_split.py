"""Where a stage's start-up goes on this machine, piece by piece (issue 48: the second run of a config's first step
should end <= 20 s after the stage's start line; on an H100 it ended 45-54 s after, ~25 s of it before the worker
was up: bench/results/first_step_h100/).

Three parts, each timed on its own so one device call says which to cut:
- imports: each module a training worker needs, in a fresh interpreter (twice: the first may write .pyc files);
- Ray Train: a TorchTrainer whose train function does nothing, on a local cluster, with and without a worker
  runtime env (ours sets env vars, which needs a fresh worker process): fit() to the worker process's start, to
  the train function's entry, to fit()'s return;
- the model: `from_pretrained` of --model onto the GPU (or the CPU), twice (the page cache warm the second time).

    python3 bench/startup_split.py --out $OUT/startup_split.json [--model /tmp/rlt/models/qwen2.5-1.5b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# What an sft worker imports, in the order it first needs them; each line is timed alone, in a fresh interpreter.
IMPORTS = ["torch", "torch; torch.cuda.is_available() and torch.cuda.init()", "ray", "ray.train.torch",
           "transformers", "peft", "datasets", "trl", "deepspeed", "liger_kernel.transformers",
           "medgpt_ray.run.stage_runner", "medgpt_ray.kinds.sft.stage",
           "medgpt_ray.run.stage_runner, medgpt_ray.kinds.sft.stage, trl, peft, deepspeed"]


def time_import(statement: str, env: dict[str, str] | None = None) -> float | str:
    modules, _, extra = statement.partition(";")
    code = (f"import time; t = time.perf_counter(); import {modules}{';' + extra if extra else ''}; "
            "print(time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=None if env is None else {**os.environ, **env})
    if done.returncode:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return round(float(done.stdout.strip().splitlines()[-1]), 2)


def bytecode_cached(package: str) -> dict[str, Any]:
    """Whether a package's modules have their .pyc beside them (or under PYTHONPYCACHEPREFIX) and whether Python
    could write them: a read-only site-packages without them recompiles every module in every new process (each Ray
    worker)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {"found": False}
    root = Path(next(iter(spec.submodule_search_locations)))
    sources = list(root.rglob("*.py"))[:3000]
    tag = sys.implementation.cache_tag
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix
    cached = sum(1 for p in sources if (Path(prefix + str(p.parent)) if prefix else p.parent / "__pycache__")
                 .joinpath(f"{p.stem}.{tag}.pyc").is_file())
    return {"root": str(root), "sources_checked": len(sources), "with_pyc": cached,
            "writable": os.access(root, os.W_OK), "pycache_prefix": prefix}


def _noop_train(config: dict[str, Any]) -> None:
    import ray.train

    from medgpt_ray.run.process_clock import process_started_wall

    entered = time.time()
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["marks"]).write_text(json.dumps({"entered": entered, "process": process_started_wall()}))


def time_ray_train(runs: int, use_gpu: bool) -> list[dict[str, Any]]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from medgpt_ray.run.ray_env import keep_bytecode, worker_env

    keep_bytecode()  # as connect_ray does before its ray.init
    ray.init(address="local", include_dashboard=False, logging_level="WARNING")
    out = []
    try:
        for i in range(runs):
            env = {"env_vars": worker_env()} if i % 2 == 0 else None  # ours first, then Ray's default env
            # The second half on gloo: on a GPU Ray Train's backend set-up makes an NCCL group (and a barrier on
            # it) before the train function runs; a one-worker stage has nothing to reduce, so this says what
            # that costs.
            backend = "gloo" if use_gpu and i >= runs // 2 else None
            with tempfile.TemporaryDirectory() as d:
                marks = Path(d, "marks.json")
                t0 = time.time()
                TorchTrainer(_noop_train, train_loop_config={"marks": str(marks)},
                             torch_config=TorchConfig(backend=backend) if backend else None,
                             scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu),
                             run_config=RunConfig(name=f"noop{i}", storage_path=d, worker_runtime_env=env,
                                                  logging_config=ray.LoggingConfig(log_level="WARNING"))).fit()
                ended = time.time()
                m = json.loads(marks.read_text())
            out.append({"worker_env_vars": env is not None, "backend": backend or "default",
                        "worker_process_s": round(m["process"] - t0, 2) if m["process"] else None,
                        "train_fn_s": round(m["entered"] - t0, 2), "fit_s": round(ended - t0, 2)})
            print("ray train:", out[-1], flush=True)
    finally:
        ray.shutdown()
    return out


def time_model_load(model: Path) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seconds = []
    for _ in range(2):
        t = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, local_files_only=True).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(round(time.perf_counter() - t, 2))
        del m
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, help="a model directory to time from_pretrained on")
    ap.add_argument("--ray-runs", type=int, default=4, help="no-op TorchTrainer fits, ours and Ray's env in turn; "
                    "on a GPU the second half on gloo")
    args = ap.parse_args(argv)

    import torch

    gpu = torch.cuda.is_available()
    doc: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]),
                           "device": torch.cuda.get_device_name() if gpu else "cpu", "imports_s": {}}
    doc["bytecode"] = {p: bytecode_cached(p) for p in ("torch", "transformers", "ray", "trl", "peft", "datasets")}
    print("bytecode:", {p: (v.get("with_pyc"), v.get("sources_checked"), v.get("writable"))
                        for p, v in doc["bytecode"].items()}, flush=True)
    # Where this environment forbids bytecode (the GPU image does), each import is timed as the environment has it,
    # then twice as a worker of ours has it (run/ray_env.keep_bytecode: kept under a cache; the first run writes
    # it); elsewhere twice as it is.
    from medgpt_ray.run.ray_env import bytecode_unplaced

    kept = ({"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="pycache-")}
            if bytecode_unplaced() else None)
    doc["imports_runs"] = ["as is", "bytecode kept (writing)", "bytecode kept"] if kept else ["as is", "as is"]
    for statement in IMPORTS:
        doc["imports_s"][statement] = ([time_import(statement)] + [time_import(statement, kept) for _ in range(2)]
                                       if kept else [time_import(statement) for _ in range(2)])
        print(f"import {statement}: {doc['imports_s'][statement]}", flush=True)
    doc["ray_train_noop"] = time_ray_train(args.ray_runs, gpu)
    if args.model:
        doc["model_load_s"] = {str(args.model): time_model_load(args.model)}
        print("model load:", doc["model_load_s"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
