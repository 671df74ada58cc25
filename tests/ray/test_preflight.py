"""A run joined to a cluster that cannot hold its workers is refused at once, naming the key (issue 16 item 7),
instead of Ray Train retrying to start the worker group every minute forever."""

from __future__ import annotations

import pytest

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.run.pipeline import Pipeline, RunOptions

pytestmark = pytest.mark.ray


def test_more_workers_than_the_cluster_has_cpus_is_refused_before_any_stage(ray_cluster, repo, tmp_path):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    cfg = PipelineConfig.model_validate({
        "name": "toomany", "output_dir": str(tmp_path), "model": {"path": "tiny"},
        "data": {"sft": [str(repo / "data/sample/sft_sharegpt.jsonl")]},
        "resources": {"num_workers": int(cpus) + 1},
        "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
                   "sft": {"method": "lora", "max_steps": 1, "effective_batch": 4}}})
    with pytest.raises(ConfigError, match=rf"resources.num_workers: stage sft needs {int(cpus) + 1} worker\(s\).*"
                                          rf"the Ray cluster has {cpus:g}"):
        Pipeline(cfg, RunOptions(echo=lambda _: None)).run()
    assert not (tmp_path / "toomany" / "sft").exists()
