"""Connecting to Ray and what Ray Train workers inherit: the one place the driver meets a Ray cluster's setup."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import ray

from medgpt_ray.memory.budget import GPUMemory, tightest_local_gpu
from medgpt_ray.run.native_logs import route_native_stderr
from medgpt_ray.run.ray_logs import route_ray_logs
from medgpt_ray.tiny import cache_root

# Workers inherit these unless the driver's environment sets them: no doubled prints / dill dumps from Train V2's
# print patch (FIELD-NOTES). The CUDA allocator grows segments instead of caching fixed blocks: with per-micro-batch
# padded lengths and the preference losses' full-vocabulary logits, cached blocks fragment; on the H200 under a
# 24 GiB cap, ORPO on Qwen2.5-0.5B (full) died with 7.3 GiB reserved but unallocated at 15.8 GiB allocated.
# The tokenizer's own threads on: sft encodes a block of conversations a call (templates.encode_sft_many), which on
# the H100 host's 16 cores took 0.71 s for 3,000 conversations with them and 1.81 s without
# (bench/results/first_step_h100_overlap/encode_speed.json). Set, not left unset: a worker that forks after encoding
# (inductor's compile pool) then gets no "parallelism has already been used" warning; no forked child tokenizes.
WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "TOKENIZERS_PARALLELISM": "true",
              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


# Ray Train's controller notices a stage's workers have finished at its next poll of them, every 2 s by default: each
# stage then ends ~1 s later than it could on average. The driver sets it; Ray Train propagates it to the controller.
CONTROLLER_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}


# How Python keeps bytecode: the workers do as the driver does (after keep_bytecode()).
BYTECODE_VARS = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")


def worker_env() -> dict[str, str]:
    """WORKER_ENV, the driver's own MEDGPT_RAY_* variables (the metrics port, the OOM back-off test hook) and its
    bytecode settings."""
    return {**{k: os.environ.get(k, v) for k, v in WORKER_ENV.items()},
            **{k: os.environ[k] for k in BYTECODE_VARS if k in os.environ},
            **{k: v for k, v in os.environ.items() if k.startswith("MEDGPT_RAY_")}}


# A worker's heaviest imports: where one of them has no bytecode beside its sources, none is being kept.
BYTECODE_PACKAGES = ("torch", "transformers", "peft", "trl", "ray")


def keep_bytecode(packages: tuple[str, ...] = BYTECODE_PACKAGES) -> str | None:
    """Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE, as container images set it), names no
    place for it, and the installed packages came without it (pip --no-compile, or --target), every new process
    compiles every module it imports from source again: each Ray worker, each stage. On the H100 image (which sets
    it) `import peft` took 20.5 s so, 11.6 s once its bytecode was kept; `import ray.train.torch` 8.9 s and 4.5 s
    (bench/results/startup_h100/). Keep it under the cache directory instead, never beside the sources
    (PYTHONPYCACHEPREFIX), for this process's later imports and for every process started after this (the local
    cluster's, and through worker_env() each stage's workers). Returns the directory, or None where nothing changed."""
    if not bytecode_unplaced():
        return None
    if not any(_without_bytecode(name) for name in packages):
        return None  # compiled at install: redirecting would only compile them all once more
    prefix = str(cache_root() / "pycache")
    os.environ.update(PYTHONDONTWRITEBYTECODE="", PYTHONPYCACHEPREFIX=prefix)
    sys.dont_write_bytecode, sys.pycache_prefix = False, prefix
    return prefix


def bytecode_unplaced() -> bool:
    """Whether this environment forbids writing bytecode and names no place of its own for it."""
    return bool(os.environ.get("PYTHONDONTWRITEBYTECODE")) and not os.environ.get("PYTHONPYCACHEPREFIX")


def _without_bytecode(package: str) -> bool:
    """Whether an installed package's __init__ has no bytecode beside it (found without importing it)."""
    spec = importlib.util.find_spec(package)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return False
    return not Path(importlib.util.cache_from_source(origin)).is_file()


def echo(line: str) -> None:
    # Flushed: under `ray job submit` stdout is a pipe, and `ray job logs` should show progress live.
    print(line, flush=True)


def auth_token_file() -> Path:
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def tighten_auth_token(path: Path | None = None) -> bool:
    """Make Ray's auth token owner-only: Ray 2.60 writes the token it generates on a local run 0644 in a 0755
    ~/.ray, and whoever reads it can run code on the cluster. True when a mode had to change."""
    path = path or auth_token_file()
    changed = False
    if path.is_file() and path.stat().st_mode & 0o077:
        path.chmod(0o600)
        changed = True
    if path.parent.name == ".ray" and path.parent.is_dir() and path.parent.stat().st_mode & 0o077:
        path.parent.chmod(0o700)
        changed = True
    return changed


def connect_ray(num_cpus: int | None = None, log_file: Path | None = None, verbose: bool = False,
                worker_logs: bool = True) -> str:
    """Join the cluster a `ray job submit` (or RAY_ADDRESS) points at; otherwise start a local one.

    `address="local"` on purpose: after `ray stop`, a stale ray_current_cluster
    file can make a bare ray.init() try to connect to a dead cluster (FIELD-NOTES).
    With `log_file`, Ray's and Ray Data's INFO lines go there instead of the terminal (unless `verbose`);
    `worker_logs=False` keeps the workers' stdout/stderr in Ray's session logs instead of echoing them.
    """
    if log_file is not None:
        route_ray_logs(log_file, verbose)
        if not verbose:
            route_native_stderr(log_file)
    for k, v in {**WORKER_ENV, **CONTROLLER_ENV}.items():
        os.environ.setdefault(k, v)
    keep_bytecode()  # before ray.init: a local cluster's processes inherit it
    if ray.is_initialized():
        return "existing"
    tighten_auth_token()  # a token copied here by hand
    if os.environ.get("RAY_ADDRESS"):
        # The job's own runtime env (its working_dir) must stay as submitted: pass none here.
        ray.init(log_to_driver=worker_logs)
        return "cluster"
    # The dashboard (loopback only; started when ray[default] is installed) serves the State API that
    # Ray Train's placement-group cleaner polls.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=None, dashboard_host="127.0.0.1",
             log_to_driver=worker_logs)
    tighten_auth_token()  # the token a local run generates
    return "local"


def probe_cluster_gpu() -> GPUMemory | None:
    """The tightest GPU: read on this machine, or by a one-GPU Ray task when the driver has none."""
    local = tightest_local_gpu()
    if local is not None or not ray.cluster_resources().get("GPU"):
        return local
    probe = ray.remote(num_gpus=1, num_cpus=0)(tightest_local_gpu)
    return ray.get(probe.remote(), timeout=300)


def _linear_kernels_here() -> dict[str, Any]:
    from medgpt_ray.hybrid.kernels import probe

    return probe().as_dict()


def probe_cluster_linear_kernels() -> dict[str, Any] | None:
    """What a GPU of the cluster runs a hybrid's linear attention on (hybrid/kernels.probe, forward and backward of
    flash-linear-attention against the reference), read by a one-GPU task: CUDA never starts on the driver. None on a
    cluster without GPUs."""
    if not ray.cluster_resources().get("GPU"):
        return None
    probe = ray.remote(num_gpus=1, num_cpus=0)(_linear_kernels_here)
    return ray.get(probe.remote(), timeout=600)
