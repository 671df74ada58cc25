"""The kto stage kind's config and plan (issue 17 item 2): its keys checked with errors naming them, memory kind
"kto" (policy + reference, one sequence per example, TRL's chunked LM head), and the micro-batch floor of 2 that
TRL's KL term needs, kept by the planner and by the OOM back-off."""

from __future__ import annotations

from dataclasses import replace

import pytest

from medgpt_ray.config import STAGE_KINDS, ConfigError, DPOStageConfig, KTOStageConfig, LoraConfig, load_config
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import TrainSetup, estimate
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.shapes import PRESETS
from medgpt_ray.memory.stage_plan import halve_micro_batch
from medgpt_ray.memory.throughput import flops_per_token

Q7 = PRESETS["qwen2.5-7b"]
KW = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=2048, effective_batch=16,
          grad_ckpt=True)


def test_kto_is_registered_off_from_sft_on_unpaired_data(repo):
    kind = STAGE_KINDS["kto"]
    assert (kind.data_kind, kind.default_from, kind.memory_kind) == ("unpaired", "sft", "kto")
    cfg = load_config(repo / "configs/tiny-cpu.yaml")
    assert not cfg.stages.kto.enabled and "kto" not in cfg.enabled_stages()
    assert (cfg.stages.kto.beta, cfg.stages.kto.loss_type, cfg.stages.kto.lr) == (0.1, "kto", 5e-6)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("beta", 0, "stages.kto.beta"),
    ("loss_type", "sigmoid", "stages.kto.loss_type"),
    ("desirable_weight", -1, "stages.kto.desirable_weight"),
    ("undesirable_weight", 0, "stages.kto.undesirable_weight"),
    ("micro_batch", 1, r"stages.kto.*micro_batch: 1 is below 2.*apo_zero_unpaired"),
    ("label_smoothing", 0.1, "stages.kto.label_smoothing"),  # a DPO key: unknown here
])
def test_kto_keys_are_checked_naming_the_key(repo, key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(repo / "configs/tiny-cpu.yaml", [f"stages.kto.{key}={value}"])


def test_apo_zero_unpaired_has_no_kl_term_and_takes_a_micro_batch_of_one():
    cfg = KTOStageConfig(loss_type="apo_zero_unpaired", micro_batch=1)
    assert (cfg.kl_batch, cfg.min_micro_batch) == (False, 1)
    assert (KTOStageConfig().kl_batch, KTOStageConfig().min_micro_batch) == (True, 2)


def test_kto_memory_is_dpos_per_sequence_with_one_sequence_per_example():
    dpo = TrainSetup(stage="dpo", method="lora", precision="bf16", micro_batch=2, seq_len=1024, fused_ce=True)
    kto = replace(dpo, stage="kto", micro_batch=4, kl_batch=True)
    assert kto.tokens() == dpo.tokens()  # 4 examples x 1 sequence = 2 pairs x 2
    assert estimate(Q7, kto).breakdown_gib() == estimate(Q7, dpo).breakdown_gib()  # chunked head, no full logits
    full = {"method": "full", "zero": 3, "gpus": 4}  # full weights: a frozen reference copy, as DPO's
    assert estimate(Q7, replace(kto, **full)).breakdown_gib()["reference_model"] == \
        estimate(Q7, replace(dpo, **full)).breakdown_gib()["reference_model"] > 3
    # The KL batch costs two more no-grad forwards per step, not memory.
    assert flops_per_token(Q7, kto) > flops_per_token(Q7, replace(kto, kl_batch=False)) > \
        flops_per_token(Q7, replace(kto, kl_batch=False, stage="sft"))


def test_the_planner_never_gives_kto_a_micro_batch_of_one():
    """A budget where DPO (2 sequences per pair) plans micro-batch 1: KTO gets 2 (two sequences, the same tokens),
    and a budget too small for 2 is refused naming the floor instead of planning 1."""
    budget = make_budget(19.5, 2, "rtx4090", True, "t")
    dpo = plan_stage("dpo", DPOStageConfig(**KW), 1, True, Q7, budget)
    assert dpo.micro_batch == 1
    kto = plan_stage("kto", KTOStageConfig(**KW), 1, True, Q7, budget)
    assert kto.micro_batch >= 2 and kto.micro_batch * kto.grad_accum == 16
    assert any("micro_batch: searched [2, 4, 8, 16]" in r for r in kto.reasons)
    assert kto.train_setup(KTOStageConfig(**KW)).kl_batch
    tight = make_budget(18, 2, "rtx4090", True, "t")
    assert plan_stage("kto", KTOStageConfig(**KW, loss_type="apo_zero_unpaired"), 1, True, Q7, tight).micro_batch == 1
    with pytest.raises(PlanError, match="other options at micro-batch 2"):
        plan_stage("kto", KTOStageConfig(**KW), 1, True, Q7, tight)
    with pytest.raises(ConfigError, match=r"stages.kto.effective_batch: 1 leaves no micro-batch of at least 2"):
        plan_stage("kto", KTOStageConfig(**{**KW, "effective_batch": 1}), 1, True, Q7, budget)


def test_the_oom_backoff_stops_kto_at_two():
    cfg = KTOStageConfig(**KW)
    plan = plan_stage("kto", cfg, 1, True, Q7, make_budget(80, 2, "h100", True, "t"))
    plan = replace(plan, micro_batch=4, grad_accum=4, ckpt_fraction=0.5)
    two = halve_micro_batch(plan, cfg, "oom", 3)
    assert (two.micro_batch, two.grad_accum, two.ckpt_fraction) == (2, 8, 0.5)
    full_ckpt = halve_micro_batch(two, cfg, "oom", 5)
    assert (full_ckpt.micro_batch, full_ckpt.grad_accum, full_ckpt.ckpt_fraction) == (2, 8, 1.0)
    assert halve_micro_batch(full_ckpt, cfg, "oom", 7) is None  # nothing left: never micro-batch 1
    odd = halve_micro_batch(replace(plan, micro_batch=3, grad_accum=5), cfg, "oom", 1)
    assert (odd.micro_batch, odd.ckpt_fraction) == (3, 1.0)  # no divisor of 3 in [2, 1]: checkpointing instead
    dpo = DPOStageConfig(**KW)
    assert halve_micro_batch(replace(full_ckpt, stage="dpo"), dpo, "oom", 7).micro_batch == 1
