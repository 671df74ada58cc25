"""Shared fixtures: the tiny model (built once, offline) and one session-scoped local Ray cluster."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.ray_startup import free_port, start_shared_cluster

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests that are not about job submission run without Ray's token auth (FIELD-NOTES).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# A run's report that cannot be written fails the run here (a user gets a warning and keeps the finished run).
os.environ.setdefault("MEDGPT_RAY_REPORT_STRICT", "1")
# Ray Train's controller notices that the workers finished at its next poll, every 2 s by default: half a second
# here saves ~1 s per Ray Train run (about twenty in the suite) and changes nothing a test asserts. Propagated to
# every controller, also those of the `jobs/pipeline.py` runs the e2e tests start (they inherit this environment).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


def pytest_collection_modifyitems(config, items):
    """Tests that connect this process to a Ray cluster of their own stop the shared session cluster: they run
    last (stable sort: every other test keeps its order), so no test that needs the shared cluster follows them."""
    items.sort(key=lambda item: item.get_closest_marker("leaves_shared_cluster") is not None)


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

    def init(temp_dir: Path) -> None:
        # The dashboard (on loopback) serves the State API that Ray Train's placement-group cleaner polls.
        # Eight logical GPUs with their per-GPU tokens (cluster/start-node.sh advertises the same on real boxes):
        # placement tests check which device each worker binds; CPU-only stages never ask for them.
        # Metrics are reported every second (default 10 s) so the Prometheus test sees a short stage.
        ray.init(address="local", num_cpus=2, num_gpus=8, resources={f"medgpt_gpu_{i}": 1 for i in range(8)},
                 dashboard_host="127.0.0.1", runtime_env={"env_vars": {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}},
                 _system_config={"metrics_report_interval_ms": 1000},
                 # Its own temp dir and dashboard port: other Ray clusters may run on this machine (CI, other
                 # checkouts). The metrics port is left to Ray, whose agent binds port 0 (the kernel's pick, no race):
                 # a free_port() released here and taken by anything before the agent binds it kills the agent, and
                 # with it the raylet ("node timed out during startup", reproduced with a held port).
                 _temp_dir=str(temp_dir), dashboard_port=free_port())

    temp_dir = start_shared_cluster(init)
    _SHARED_CLUSTER["temp_dir"] = temp_dir
    yield ray
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


_SHARED_CLUSTER: dict[str, Path] = {}


@pytest.fixture(scope="session")
def ray_temp_dir(ray_cluster) -> Path:
    """The temp dir of the shared cluster (its Prometheus service-discovery file is there)."""
    return _SHARED_CLUSTER["temp_dir"]
