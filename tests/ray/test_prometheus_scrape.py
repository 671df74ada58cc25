"""A real Prometheus scrapes the shared Ray cluster while the shared tiny run trains, and PromQL finds the run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_a_tiny_stage_is_visible_in_prometheus(tiny_run):
    prom, run = tiny_run.prom, tiny_run.name
    loss = prom.wait_for(f'last_over_time(ray_medgpt_train_loss{{run="{run}", stage="sft"}}[10m])')
    assert loss[0]["metric"]["rank"] == "0" and float(loss[0]["value"][1]) > 0
    tps = prom.wait_for(f'max(last_over_time(ray_medgpt_train_tokens_per_second{{run="{run}"}}[10m]))')
    assert float(tps[0]["value"][1]) > 0
    done = prom.wait_for(f'last_over_time(ray_medgpt_pipeline_stage_state{{run="{run}", stage="sft", '
                         f'state="done"}}[10m]) == 1')
    assert done
