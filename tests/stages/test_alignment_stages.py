"""The reference-free preference stages (orpo, simpo) and DPO's loss family on the tiny model, in a plain process:
each trains, moves the weights, and hands TRL what the config says (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medgpt_ray.config import DPOStageConfig, KTOStageConfig, LoraConfig, ORPOStageConfig, SimPOStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage, run_stage
from medgpt_ray.stages.inputs import StageInputs

CLASSES = {"orpo": ORPOStageConfig, "simpo": SimPOStageConfig, "dpo": DPOStageConfig}


@pytest.fixture(scope="module")
def pairs(repo, tmp_path_factory):
    # Easy pairs (these tests check wiring, not learning: tests/stages/test_pair_learning.py learns the shipped hard
    # ones) and MedicalGPT's ShareGPT ones, whose tool-calling prompts alone fill 128 tokens.
    files = [str(repo / "tests/data/easy_reward_pairs.jsonl"),
             str(repo / "data/sample/formats/preference_sharegpt.jsonl")]
    return prepare_kind("preference", files, tmp_path_factory.mktemp("pairs"), 0.1, max_records=64)


def inputs(stage: str, pairs, model: Path, out: Path, **keys) -> StageInputs:
    kw = dict(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=4, seq_len=128,
              effective_batch=4, logging_steps=1, save_steps=100)
    cfg = CLASSES[stage](**{**kw, **keys})
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs(stage, cfg, plan_stage(stage, cfg, 1, False), str(model), "chatml", pairs.train_file,
                       pairs.eval_file, str(out))


@pytest.mark.parametrize("stage", ["orpo", "simpo"])
def test_a_reference_free_stage_trains_from_the_base_model(stage, pairs, tiny_model, tmp_path):
    """Loss down, weights moved, tokens counted; pairs whose prompt alone fills seq_len are left out and counted
    (TRL would give them an empty answer: a NaN loss)."""
    import json
    import math

    from safetensors.torch import load_file

    r = run_stage(inputs(stage, pairs, tiny_model, tmp_path))
    assert r["steps"] == 4 and r["train_loss_last"] < r["train_loss_first"]
    assert 0.0 <= r["eval"]["eval_reward_accuracy"] <= 1.0 and r["eval"]["eval_pairs"] > 0
    assert r["skipped_too_long"] > 0 and math.isfinite(r["eval"]["eval_loss"])
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(s["tokens_per_s"] > 0 for s in steps if "loss" in s and "tokens_per_s" in s)
    before, after = load_file(str(tiny_model / "model.safetensors")), load_file(
        str(Path(r["output_model"]) / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_the_trainers_get_the_methods_parameters(pairs, tiny_model, tmp_path):
    simpo = build_stage(inputs("simpo", pairs, tiny_model, tmp_path / "s", beta=2.5, gamma=1.2, cpo_alpha=0.1))
    t = simpo.trainer
    assert (t.loss_type, t.beta, t.simpo_gamma, t.cpo_alpha) == ("simpo", 2.5, 1.2, 0.1)
    assert not hasattr(t, "ref_model") or t.ref_model is None  # reference-free
    orpo = build_stage(inputs("orpo", pairs, tiny_model, tmp_path / "o", beta=0.3))
    assert orpo.trainer.beta == 0.3
    dpo = build_stage(inputs("dpo", pairs, tiny_model, tmp_path / "d", loss_type=["robust", "bco_pair"],
                             loss_weights=[0.7, 0.3], label_smoothing=0.1))
    t = dpo.trainer
    assert (t.loss_types, t.loss_weights, t.label_smoothing) == (["robust", "bco_pair"], [0.7, 0.3], 0.1)


@pytest.mark.parametrize("stage", ["orpo", "simpo"])
def test_a_qlora_model_keeps_its_base_weights_bf16_and_trains(stage, pairs, tiny_model, tmp_path, monkeypatch):
    """TRL's ORPO/CPO call peft.prepare_model_for_kbit_training on a model whose `is_loaded_in_4bit` is set, which
    casts every bf16 parameter that is not 4-bit to fp32 (a MoE's unquantized experts: twice the memory the planner
    prices). bitsandbytes cannot load here: the tiny bf16 model with that flag, the one attribute TRL reads, takes
    TRL's QLoRA branch. Every base parameter stays bf16, and one checkpointed step still moves the adapter."""
    import dataclasses
    import math

    from medgpt_ray import models

    load = models.load_causal_lm

    def load_flagged(*args, **kwargs):
        model = load(*args, **kwargs)
        model.is_loaded_in_4bit = True
        return model

    monkeypatch.setattr(models, "load_causal_lm", load_flagged)
    inp = inputs(stage, pairs, tiny_model, tmp_path, max_steps=1, effective_batch=2, warmup_ratio=0.0)
    inp.plan = dataclasses.replace(inp.plan, precision="bf16", ckpt_fraction=1.0)
    built = build_stage(inp)
    model = built.trainer.model
    named = dict(model.named_parameters())
    base = {n: p.dtype for n, p in named.items() if "lora_" not in n}
    assert base and set(base.values()) == {torch.bfloat16}, {n: d for n, d in base.items() if d != torch.bfloat16}
    assert built.lora and all(not named[n].requires_grad for n in base)
    adapter = {n: p.detach().clone() for n, p in named.items() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    out = built.trainer.train()
    assert math.isfinite(out.training_loss)
    assert any(not torch.equal(adapter[n], named[n].detach()) for n in adapter)


def test_a_dpo_loss_of_the_family_trains(pairs, tiny_model, tmp_path):
    r = run_stage(inputs("dpo", pairs, tiny_model, tmp_path, loss_type="ipo", beta=0.5))
    assert r["steps"] == 4 and r["train_loss_last"] < r["train_loss_first"]


# ---- kto (TRL's KTOTrainer on unpaired examples) --------------------------------------------------------------


@pytest.fixture(scope="module")
def unpaired(repo, tmp_path_factory):
    # KTO's own examples and the preference pairs above, each pair two examples (chosen true, rejected false).
    files = [str(repo / "data/sample/formats/unpaired_kto.jsonl"), str(repo / "data/sample/reward.jsonl"),
             str(repo / "data/sample/formats/preference_sharegpt.jsonl")]
    return prepare_kind("unpaired", files, tmp_path_factory.mktemp("unpaired"), 0.25, max_records=64)


def kto_inputs(unpaired, model: Path, out: Path, **keys) -> StageInputs:
    # No warmup: the first step (policy = reference, loss 0.5 exactly) updates the adapter, the second sees it.
    kw = dict(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=2, seq_len=128,
              effective_batch=4, logging_steps=1, save_steps=100, warmup_ratio=0.0)
    cfg = KTOStageConfig(**{**kw, **keys})
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs("kto", cfg, plan_stage("kto", cfg, 1, False), str(model), "chatml", unpaired.train_file,
                       unpaired.eval_file, str(out))


def test_kto_trains_on_unpaired_examples_and_scores_held_out_pairs(unpaired, tiny_model, tmp_path):
    """Two steps from the tiny model: a finite loss that changes, both labels trained, the held-out pairs ranked by
    the implicit reward (an accuracy in [0, 1] over the pairs held out), the adapter saved and merged."""
    import math

    from safetensors.torch import load_file

    inp = kto_inputs(unpaired, tiny_model, tmp_path)
    assert inp.plan.micro_batch >= 2  # TRL's KL term
    r = run_stage(inp)
    assert r["steps"] == 2 and math.isfinite(r["train_loss_first"]) and math.isfinite(r["train_loss_last"])
    assert r["train_loss_first"] == pytest.approx(0.5) and r["train_loss_last"] != r["train_loss_first"]
    assert r["train_desirable"] > 0 and r["train_undesirable"] > 0
    assert r["workers"][0]["shard"]["trained_examples"] >= 2 * 4  # steps x effective batch (+ a batch prefetched)
    ev = r["eval"]
    assert ev["eval_pairs"] > 0 and 0.0 <= ev["eval_reward_accuracy"] <= 1.0 and math.isfinite(ev["eval_loss"])
    assert ev["eval_reward_margin"] != 0.0  # the adapter moved the policy away from its reference
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    before, after = load_file(str(tiny_model / "model.safetensors")), load_file(
        str(Path(r["output_model"]) / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_kto_trainer_gets_the_methods_parameters(unpaired, tiny_model, tmp_path):
    built = build_stage(kto_inputs(unpaired, tiny_model, tmp_path, beta=0.3, desirable_weight=1.5,
                                   undesirable_weight=0.7, loss_type="apo_zero_unpaired", micro_batch=1))
    t = built.trainer
    assert (t.beta, t.desirable_weight, t.undesirable_weight, t.loss_type) == (0.3, 1.5, 0.7, "apo_zero_unpaired")
    assert not t.calculate_KL and t.args.per_device_train_batch_size == 1 and t.ref_model is None  # LoRA: adapter off
    assert len(built.held_out) > 0
