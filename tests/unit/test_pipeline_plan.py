"""The stage DAG's bookkeeping, without Ray: which stages rerun, in which waves, from which model."""

from __future__ import annotations

import pytest

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.run import dag
from medgpt_ray.run.pipeline import Pipeline, RunOptions
from medgpt_ray.run.upstream import PipelineError


def make(tmp_path, **stages) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "model": {"path": "tiny"}, "output_dir": str(tmp_path),
        "stages": {k: {"enabled": v} for k, v in stages.items()},
    })


def test_from_stage_reruns_it_and_everything_downstream(tmp_path):
    p = Pipeline(make(tmp_path), RunOptions(from_stage="sft"))
    assert p._forced_stages(["pt", "sft", "rm", "dpo"]) == {"sft", "rm", "dpo"}
    p = Pipeline(make(tmp_path), RunOptions(from_stage="rm"))
    assert p._forced_stages(["pt", "sft", "rm", "dpo"]) == {"rm"}


def test_only_stage_reruns_it_alone(tmp_path):
    p = Pipeline(make(tmp_path), RunOptions(only_stage="dpo"))
    assert p._forced_stages(["pt", "sft", "rm", "dpo"]) == {"dpo"}


def test_rm_and_dpo_share_a_wave(tmp_path):
    p = Pipeline(make(tmp_path))
    assert p._waves(["pt", "sft", "rm", "dpo"]) == [["pt"], ["sft"], ["rm", "dpo"]]


def test_a_disabled_stage_hands_its_input_to_its_dependants(tmp_path):
    cfg = make(tmp_path, sft=False)
    assert dag.effective_from(cfg, "dpo") == "pt"
    assert Pipeline(cfg)._waves(cfg.enabled_stages()) == [["pt"], ["rm", "dpo"]]
    cfg = make(tmp_path, pt=False, sft=False)
    assert dag.effective_from(cfg, "rm") is None


def test_only_stage_of_a_disabled_stage_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="stages.rm.enabled"):
        Pipeline(make(tmp_path, rm=False), RunOptions(only_stage="rm"))


def test_missing_upstream_output_names_the_stage(tmp_path):
    p = Pipeline(make(tmp_path))
    with pytest.raises(PipelineError, match="stage dpo starts from the output of stage sft"):
        p._upstream_model("dpo", tmp_path)


def _sft_fingerprint(tmp_path, **sft) -> str:
    """The sft stage's fingerprint for the default stages with `sft` keys set, planned as the pipeline plans."""
    from medgpt_ray.memory.planner import plan_all

    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}, "output_dir": str(tmp_path),
                                         "resources": {"num_workers": 2},
                                         "stages": {"sft": {"method": "lora", "effective_batch": 8, **sft}}})
    plans, errors = plan_all(cfg)
    assert not errors
    prov = {"git_commit": "c0ffee", "packages": {"torch": "x"}}
    return dag.fingerprint(cfg, "sft", plans["sft"], "data-fp", "pt-fp", {"hidden_size": 8}, prov)


def test_memory_knobs_explicit_or_planned_do_not_change_the_fingerprint_but_lr_does(tmp_path):
    planned = _sft_fingerprint(tmp_path)
    # The tiny CPU plan picks micro-batch 4 without checkpointing; other explicit layouts of the same
    # updates must not retrain a finished stage.
    assert _sft_fingerprint(tmp_path, micro_batch=1) == planned
    assert _sft_fingerprint(tmp_path, micro_batch=2, grad_ckpt=True) == planned
    assert _sft_fingerprint(tmp_path, grad_ckpt=0.5, zero_stage=0, offload="none", compile=False) == planned
    assert _sft_fingerprint(tmp_path, lr=1e-3) != planned
    assert _sft_fingerprint(tmp_path, effective_batch=16) != planned
    assert _sft_fingerprint(tmp_path, method="full") != planned
    # Packing is no memory knob: it changes which conversations share a step (the default is auto).
    assert _sft_fingerprint(tmp_path, packing="auto") == planned
    assert _sft_fingerprint(tmp_path, packing=False) != planned
    assert _sft_fingerprint(tmp_path, packing=False, micro_batch=1) == _sft_fingerprint(tmp_path, packing=False)
    # So is grouping by length (it decides which examples share a step; default true).
    assert _sft_fingerprint(tmp_path, group_by_length=True) == planned
    assert _sft_fingerprint(tmp_path, group_by_length=False) != planned


def test_only_stage_is_checked_against_the_manifest_before_ray_starts(tmp_path):
    import json

    from medgpt_ray.run.upstream import check_only_stage

    cfg = make(tmp_path)
    with pytest.raises(PipelineError, match="stage dpo starts from the output of stage sft, which is not finished"):
        check_only_stage(cfg, "dpo")
    model = tmp_path / "sft-model"
    model.mkdir()
    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "manifest.json").write_text(json.dumps({"stages": {"sft": {"output_model": str(model)}}}))
    check_only_stage(cfg, "dpo")  # sft finished: nothing to say
    check_only_stage(make(tmp_path, pt=False), "sft")  # starts from the base model
