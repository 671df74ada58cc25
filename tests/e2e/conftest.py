"""End-to-end tests start their own Ray clusters (local ones inside `jobs/pipeline.py`, and a `ray start
--head`): stop the shared session cluster first, so its dashboard agent does not hold the default agent
port that a new head's job agent needs."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _no_shared_cluster():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
