"""End-to-end tests start their own Ray clusters (local ones inside `jobs/pipeline.py` and `medgpt-ray clean`,
each under its own RAY_TMPDIR, and a `ray start --head` on free ports, agents included): the shared session
cluster stays up beside them, so a test can run what needs no cluster of its own on it instead of starting
another. Only a test that connects this process to a cluster of its own (the two-node test) leaves the shared
one: it is marked `leaves_shared_cluster` and runs last (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def own_ray_connection():
    """Disconnect from (and so stop) the shared session cluster: the test connects this process elsewhere."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
