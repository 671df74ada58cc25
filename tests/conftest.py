"""Shared fixtures: the tiny model (built once, offline) and one session-scoped local Ray cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests that are not about job submission run without Ray's token auth (FIELD-NOTES).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from medgpt_ray.tiny import ensure_tiny

    return ensure_tiny()


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    # The dashboard (on loopback) serves the State API that Ray Train's placement-group cleaner polls.
    # Eight logical GPUs with their per-GPU tokens (cluster/start-node.sh advertises the same on real boxes):
    # placement tests check which device each worker binds; CPU-only stages never ask for them.
    # Metrics are reported every second (default 10 s) so the Prometheus test sees a short stage.
    ray.init(address="local", num_cpus=2, num_gpus=8, resources={f"medgpt_gpu_{i}": 1 for i in range(8)},
             dashboard_host="127.0.0.1", runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}},
             _system_config={"metrics_report_interval_ms": 1000})
    yield ray
    ray.shutdown()
