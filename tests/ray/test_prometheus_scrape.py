"""A real Prometheus scrapes the shared Ray cluster while the shared tiny run trains, and PromQL finds the run."""

from __future__ import annotations

import pytest

from tests.promserver import tiny_run_series

pytestmark = pytest.mark.ray


def test_a_tiny_stage_is_visible_in_prometheus(tiny_run):
    loss_q, tps_q, done_q = tiny_run_series(tiny_run.name)
    loss = tiny_run.prom.wait_for(loss_q, timeout=10)  # scraped while the run went on (tests/ray/conftest.py)
    assert loss[0]["metric"]["rank"] == "0" and float(loss[0]["value"][1]) > 0
    tps = tiny_run.prom.wait_for(tps_q, timeout=10)
    assert float(tps[0]["value"][1]) > 0
    assert tiny_run.prom.wait_for(done_q, timeout=10)
