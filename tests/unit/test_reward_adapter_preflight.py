"""An rloo/grpo stage that scores with the rm's adapter on its own base (reward_shared_base) and an rm finished in
an earlier run: the adapter is checked on the driver (--only-stage before Ray starts; a run before any stage is
scheduled), not on the stage's worker after Ray Train has started."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import load_config
from medgpt_ray.run.pipeline import Pipeline
from medgpt_ray.run.upstream import PipelineError, check_only_stage
from medgpt_ray.stages.reward_adapter import ADAPTER_FILES, BASE_FILE, REWARD_ADAPTER, SCORE_FILE


def finished_run(repo, tmp_path):
    cfg = load_config(repo / "configs/tiny-cpu-rl.yaml", sets=["stages.rm.method=lora", "stages.rloo.method=lora",
                                                               f"output_dir={tmp_path}"])
    assert cfg.stages.get("rloo").reward_shared_base is True
    outputs = {s: tmp_path / cfg.name / s / "model" for s in ("sft", "rm")}
    for model in outputs.values():
        model.mkdir(parents=True)
    (tmp_path / cfg.name / "manifest.json").write_text(json.dumps(
        {"stages": {s: {"output_model": str(m)} for s, m in outputs.items()}}))
    return cfg, outputs


def keep_adapter(rm_model, trained_on) -> None:
    where = rm_model.parent / REWARD_ADAPTER
    where.mkdir()
    for name in (*ADAPTER_FILES, SCORE_FILE):
        (where / name).write_text("{}")
    (where / BASE_FILE).write_text(json.dumps({"base_model": str(trained_on), "method": "lora"}))


def test_only_stage_refuses_an_rm_output_without_its_adapter_before_ray_starts(repo, tmp_path):
    cfg, out = finished_run(repo, tmp_path)
    with pytest.raises(PipelineError, match=r"stages\.rloo\.reward_shared_base: the rm stage's output .* has no "
                                            r"reward adapter .*Rerun rm \(--from-stage rm\)"):
        check_only_stage(cfg, "rloo")
    keep_adapter(out["rm"], out["sft"])
    check_only_stage(cfg, "rloo")  # the adapter rm kept, trained on sft's model: nothing to say


def test_an_adapter_trained_on_another_base_is_refused(repo, tmp_path):
    cfg, out = finished_run(repo, tmp_path)
    keep_adapter(out["rm"], tmp_path / "elsewhere")
    with pytest.raises(PipelineError, match="the rm stage's adapter was trained on .*elsewhere"):
        check_only_stage(cfg, "rloo")


def test_a_run_checks_the_finished_rms_adapter_unless_rm_reruns(repo, tmp_path):
    cfg, out = finished_run(repo, tmp_path)
    pipeline = Pipeline(cfg)
    with pytest.raises(PipelineError, match="has no reward adapter"):
        pipeline._check_reward_adapters(["rloo"], tmp_path)
    pipeline._check_reward_adapters(["rm", "rloo"], tmp_path)  # rm reruns and writes its own
    # a stage that does not score with the shared base is not checked (nor is its upstream read)
    plain = load_config(repo / "configs/tiny-cpu-rl.yaml", sets=[f"output_dir={tmp_path / 'plain'}"])
    Pipeline(plain)._check_reward_adapters(plain.enabled_stages(), tmp_path)
