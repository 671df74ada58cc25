from pathlib import Path

import pytest

from medgpt_ray.config import ConfigError, load_config
from medgpt_ray.memory.planner import plan_stage

MINIMAL = "model: {path: tiny}\n"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, MINIMAL + "stages: {sft: {learning_rate: 1.0e-4}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value)
    assert "unknown key 'stages.sft.learning_rate'" in str(e.value)


def test_bad_enum_lists_allowed_values(tmp_path):
    p = write(tmp_path, MINIMAL + "stages: {dpo: {loss_type: hinge2}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "stages.dpo.loss_type" in msg
    for allowed in ("sigmoid", "ipo", "hinge", "robust"):
        assert allowed in msg


def test_set_overrides_are_typed_and_checked(tmp_path):
    p = write(tmp_path, MINIMAL)
    cfg = load_config(p, ["stages.sft.lr=1e-4", "stages.rm.enabled=false", "stages.sft.lora.rank=4"])
    assert cfg.stages.sft.lr == pytest.approx(1e-4)
    assert cfg.stages.rm.enabled is False
    assert cfg.stages.sft.lora.rank == 4
    assert cfg.enabled_stages() == ["pt", "sft", "dpo"]
    with pytest.raises(ConfigError, match=r"--set.*unknown key 'stages.sft.lrr'"):
        load_config(p, ["stages.sft.lrr=1"])


def test_overrides_file_of_dotted_keys(tmp_path):
    p = write(tmp_path, MINIMAL)
    ov = write(tmp_path, "stages.dpo.beta: 0.25\nstages.dpo.lr: 1.0e-6\n", "ov.yaml")
    cfg = load_config(p, overrides_file=ov)
    assert cfg.stages.dpo.beta == 0.25 and cfg.stages.dpo.lr == 1e-6


def test_missing_model_path_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="model"):
        load_config(write(tmp_path, "name: x\n"))


def test_shipped_configs_load(repo):
    for cfg_file in sorted((repo / "configs").glob("*.yaml")):
        cfg = load_config(cfg_file)
        for s in cfg.enabled_stages():
            plan_stage(s, cfg.stages.get(s), cfg.workers_for(s), cfg.resources.use_gpu)


def test_planner_rejects_batch_not_divisible_by_workers(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "stages: {sft: {effective_batch: 6}}\n"))
    with pytest.raises(ConfigError, match="stages.sft.effective_batch"):
        plan_stage("sft", cfg.stages.sft, 4, False)


def test_qlora_on_cpu_is_refused_before_anything_loads(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "stages: {sft: {method: qlora}}\n"))
    with pytest.raises(ConfigError, match="qlora.*GPU"):
        plan_stage("sft", cfg.stages.sft, 1, False)


def test_deepspeed_dict_is_concrete_and_agrees_with_the_plan(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "stages: {pt: {method: full, effective_batch: 32, zero_stage: 3,"
                                                " offload: optimizer}}\n"))
    plan = plan_stage("pt", cfg.stages.pt, 4, True)
    ds = plan.deepspeed
    assert ds is not None and "auto" not in str(ds)
    assert ds["train_batch_size"] == 32 == plan.micro_batch * plan.grad_accum * 4
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["bf16"]["enabled"] is True  # amp-bf16 for full training on GPU
