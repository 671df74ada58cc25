"""End-to-end tests start their own Ray clusters (local ones inside `jobs/pipeline.py` and `medgpt-ray clean`,
each under its own RAY_TMPDIR, and a `ray start --head` on free ports, agents included): the shared session
cluster stays up beside them, so a test can run what needs no cluster of its own on it instead of starting
another. Only a test that connects this process to a cluster of its own (the two-node test) leaves the shared
one: it is marked `leaves_shared_cluster` and runs last (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.ray_startup import restart_shared_cluster


@pytest.fixture(scope="package", autouse=True)
def _fresh_shared_cluster():
    """The e2e tests start clusters of their own beside the shared one, on two cores: the shared one starts them
    without the idle actors the Ray tests before them left on it."""
    restart_shared_cluster()
    yield


@pytest.fixture
def own_ray_connection():
    """Disconnect from (and so stop) the shared session cluster: the test connects this process elsewhere."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
