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


def test_one_data_path_is_read_as_a_list_of_one_and_a_number_is_named(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL + "data: {sft: data/sample/sft_sharegpt.jsonl}\n"))
    assert cfg.data.sft == ["data/sample/sft_sharegpt.jsonl"]
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, MINIMAL + "data: {sft: 5}\n", "d.yaml"))
    assert "data.sft" in str(e.value)


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


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Every shipped sweep, with the shipped config it is meant for (a new sweep must be added here).
SWEEP_CONFIGS = {"sft-lora.yaml": "qwen2.5-7b-4x4090.yaml", "sft-tiny.yaml": "tiny-cpu.yaml",
                 "orpo-tiny.yaml": "tiny-cpu-alignment.yaml"}


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_config_plans_every_stage_with_its_model_shape_in_24_gib(name):
    from medgpt_ray.memory.planner import model_shape, plan_all

    cfg = load_config(CONFIGS / name)
    # No GPU is read here: a GPU config is planned for a 24 GiB card (an RTX 4090), as `medgpt-ray plan` does.
    plans, errors = plan_all(cfg, probe=lambda: None, default_gpu_gib=24.0)
    assert errors == {}
    every = ["pt", "sft", "rm", "dpo", "orpo", "simpo", "kto"]
    expected = ["sft", "rm", "grpo", "rloo"] if name == "tiny-cpu-rl.yaml" else every[:7 if "alignment" in name else 4]
    expected += ["eval"] if name.startswith("tiny-cpu") and name not in ("tiny-cpu-rl.yaml", "tiny-cpu-opd.yaml") \
        else []  # the demo configs
    expected = ["sft", "opd"] if name == "tiny-cpu-opd.yaml" else expected
    assert list(plans) == cfg.enabled_stages() == expected
    shape = model_shape(cfg)
    assert shape.name == (cfg.model.shape or "tiny")
    for p in plans.values():
        assert p.prediction.model == shape.name
        assert p.micro_batch * p.grad_accum * p.num_workers == cfg.stages.get(p.stage).effective_batch
        if cfg.resources.use_gpu:
            assert p.prediction.gpu_memory_gib == 24.0
            assert 0 < p.prediction.peak_gib <= p.prediction.budget_gib == 24.0 - cfg.resources.memory_margin_gib


@pytest.mark.parametrize("sweep", sorted(SWEEP_CONFIGS))
def test_shipped_sweep_loads_with_its_config_and_plans_its_trials(sweep):
    from medgpt_ray.tune.driver import run_sweep

    assert sorted(SWEEP_CONFIGS) == sorted(p.name for p in (CONFIGS / "sweeps").glob("*.yaml"))
    lines: list[str] = []
    out = run_sweep(str(CONFIGS / SWEEP_CONFIGS[sweep]), [], str(CONFIGS / "sweeps" / sweep), echo=lines.append,
                    dry_run=True)
    rows = out["rows"]
    assert rows and {r["status"] for r in rows} <= {"fits", "pruned"}
    assert any(r["status"] == "fits" for r in rows)
    for r in rows:
        assert r["predicted_peak_gib"] > 0
        if r["status"] == "pruned":  # only what is over the 24 GiB card (less the margin) is pruned
            assert r["predicted_peak_gib"] > 22.0


def test_a_sweep_of_a_stage_that_trains_nothing_is_refused(tmp_path):
    from medgpt_ray.tune.sweep import load_sweep

    cfg = load_config(write(tmp_path, MINIMAL), ["stages.sft.max_steps=0"])
    sweep = write(tmp_path, "stage: sft\nscheduler: none\nspace: {lr: {choice: [0.1, 0.2]}}\n", "s.yaml")
    with pytest.raises(ConfigError, match="max_steps 0 trains nothing"):
        load_sweep(sweep, cfg)
    zero_in_space = write(tmp_path, "stage: sft\nscheduler: none\nspace: {max_steps: {choice: [0, 4]}}\n", "z.yaml")
    with pytest.raises(ConfigError, match=r"z.yaml: the sweep trains stages.sft"):
        load_sweep(zero_in_space, load_config(write(tmp_path, MINIMAL)))
    fine = write(tmp_path, "stage: sft\nscheduler: none\nspace: {max_steps: {randint: [1, 4]}}\n", "f.yaml")
    assert load_sweep(fine, load_config(write(tmp_path, MINIMAL))).stage == "sft"


def test_asha_without_evaluations_is_refused_naming_the_key(tmp_path):
    from medgpt_ray.tune.sweep import load_sweep

    sweep = write(tmp_path, "stage: sft\nscheduler: asha\nspace: {lr: {choice: [0.1, 0.2]}}\n", "s.yaml")
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ConfigError, match="stages.sft.eval_steps is not set"):
        load_sweep(sweep, cfg)
    assert load_sweep(sweep).scheduler == "asha"  # the file alone is fine; the pairing is not
    assert load_sweep(sweep, load_config(write(tmp_path, MINIMAL + "stages: {sft: {eval_steps: 5}}\n"))).stage == "sft"
    none = write(tmp_path, "stage: sft\nscheduler: none\nspace: {lr: {choice: [0.1]}}\n", "n.yaml")
    assert load_sweep(none, cfg).scheduler == "none"


def test_trials_take_turns_on_an_explicit_placement_or_share_the_gpus():
    from medgpt_ray.placement.topology import load_topology_file
    from medgpt_ray.tune.sweep import trial_gpu_groups

    topo = load_topology_file("8x4090-switches-single-socket")
    groups = trial_gpu_groups(topo, 2, "auto")
    assert len(groups) == 4 and sorted(g for s in groups for g in s) == list(range(8))
    assert trial_gpu_groups(topo, 2, [5, 6]) == [[5, 6]]


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


def test_docs_configs_md_stage_keys_are_generated_from_the_config_classes(repo):
    """docs/configs.md's per-stage key list is what medgpt_ray.config.keys generates from the field docs (a field
    without a doc fails here too); regenerate with `python -m medgpt_ray.config.keys docs/configs.md`."""
    from medgpt_ray.config.keys import BEGIN, DOC, END, stage_keys_block

    assert DOC == "docs/configs.md"
    doc = (repo / DOC).read_text(encoding="utf-8")
    block = doc[doc.index(BEGIN): doc.index(END) + len(END)]
    assert block == stage_keys_block()
    for key in ("`from`", "`needs`", "`eval_steps`", "`lora.rank`", "`beta`", "`placement`"):
        assert key in block
