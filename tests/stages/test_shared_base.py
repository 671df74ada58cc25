"""One frozen base for policy and reward (reward_shared_base, stages/reward_adapter.py), on the tiny model in a plain
process: a LoRA rm stage keeps its adapter and score head beside its merged model; loaded into the policy's PeftModel
as a second, frozen adapter they score exactly as the merged rm does, without touching what trains; and an rloo stage
trains on them with no second network, the reward adapter unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import LoraConfig, RLOOStageConfig, StageConfig
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.reward_adapter import ADAPTER_NAME, SharedBaseScore, reward_adapter_for
from medgpt_ray.stages.rewards import RewardModelScore
from tests.stages.test_rloo_stage import data  # noqa: F401  (the department prompts and pairs)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py
PROMPTS = ["<|im_start|>user\n胸痛，去哪个科室？<|im_end|>\n<|im_start|>assistant\n", "头痛看什么科", "x"] * 3
COMPLETIONS = ["心内科", "神经内科 and a longer answer than the others", "", "呼吸科", "骨科骨科骨科", "a",
               "<think>t</think><answer>心内科</answer>", "消化内科", "眼科"]


@pytest.fixture(scope="module")
def lora_rm(data, tiny_model, tmp_path_factory) -> dict:  # noqa: F811
    """A finished rm stage trained with LoRA (dropout on: scoring must switch it off), 2 steps."""
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.1), lr=1e-2, max_steps=2, seq_len=96,
                      effective_batch=4, logging_steps=1, save_steps=100, warmup_ratio=0.0)
    d = data["preference"]
    out = tmp_path_factory.mktemp("rm")
    return run_stage(StageInputs("rm", cfg, plan_stage("rm", cfg, 1, False), str(tiny_model), "chatml",
                                 d.train_file, d.eval_file, str(out)))


@pytest.fixture(scope="module")
def policy(tiny_model, lora_rm):
    """The policy as TRL builds it (the base + a LoRA adapter, in training mode), its adapter's B made non-zero (a
    scorer that used it would score otherwise), and the shared-base scorer attached."""
    from peft import get_peft_model

    torch.manual_seed(0)
    base = models.load_causal_lm(tiny_model, "fp32", "lora")
    model = get_peft_model(base, models.lora_config(LoraConfig(rank=8, alpha=16, dropout=0.1), "CAUSAL_LM", base))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.default" in name:
                p.normal_(0, 0.5)
    model.train()
    grads_before = {n: p.requires_grad for n, p in model.named_parameters()}
    scorer = SharedBaseScore(reward_adapter_for(lora_rm["output_model"], str(tiny_model), "rloo"),
                             lora_rm["output_model"])
    scorer.attach(model)
    return model, scorer, grads_before


def test_a_lora_rm_keeps_its_adapter_and_score_head_beside_the_merged_model(lora_rm, tiny_model):
    where = Path(lora_rm["reward_adapter"])
    assert where == Path(lora_rm["output_model"]).parent / "reward_adapter"
    assert sorted(p.name for p in where.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                       "base.json", "score.safetensors"]
    assert json.loads((where / "base.json").read_text()) == {"base_model": str(tiny_model.resolve()),
                                                              "method": "lora"}
    config = json.loads((where / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM" and config["modules_to_save"] is None
    assert (Path(lora_rm["output_model"]) / "config.json").is_file()  # the merged model stays


def test_the_shared_base_scores_as_the_merged_reward_model(policy, lora_rm):
    model, scorer, _ = policy
    merged = RewardModelScore(lora_rm["output_model"])(PROMPTS, COMPLETIONS)
    shared = scorer(PROMPTS, COMPLETIONS)
    assert shared == pytest.approx(merged, abs=1e-5)
    # Not by accident: the rm's adapter moves the scores (the base alone, every adapter off, scores otherwise).
    with model.disable_adapter(), torch.no_grad():
        hidden = model.get_base_model().model(**scorer._tok([PROMPTS[0] + COMPLETIONS[0] + scorer._tok.eos_token],
                                                            return_tensors="pt")).last_hidden_state
    assert abs(scorer.head(hidden[:, -1]).item() - shared[0]) > 1e-3


def test_scoring_changes_neither_what_trains_nor_the_active_adapter(policy):
    model, scorer, grads_before = policy
    assert model.training  # as it was before the reward adapter was loaded
    loaded = {n: p.requires_grad for n, p in model.named_parameters()}
    reward = [n for n in loaded if f".{ADAPTER_NAME}." in n]
    assert reward and not any(loaded[n] for n in reward)  # the reward adapter: loaded frozen
    assert {n: g for n, g in loaded.items() if n not in reward} == grads_before  # the policy's: as before
    assert any(grads_before.values())
    scorer(PROMPTS[:4], COMPLETIONS[:4])
    assert {n: p.requires_grad for n, p in model.named_parameters()} == loaded
    assert model.active_adapters == ["default"] and model.training
    assert not any(p.requires_grad for p in scorer.head.parameters())


class Snapshot(TrainerCallback):
    """The LoRA weights of the trainer's model when training begins and ends."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}


def test_rloo_trains_its_adapter_on_the_shared_base_and_the_reward_adapter_stays(
        data, tiny_model, lora_rm, tmp_path):  # noqa: F811
    cfg = RLOOStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=2,
                          seq_len=96, effective_batch=8, num_generations=4, max_completion_length=6,
                          logging_steps=1, save_steps=100, warmup_ratio=0.0, beta=0.05, reward_shared_base=True)
    plan = plan_stage("rloo", cfg, 1, False)
    assert plan.reward_model_on.startswith("the policy's own base (shared base)")
    d = data["prompt"]
    watch = Snapshot()
    r = run_stage(StageInputs("rloo", cfg, plan, str(tiny_model), "chatml", d.train_file, d.eval_file, str(tmp_path),
                              needs={"rm": lora_rm["output_model"]}), callbacks=[watch])
    assert r["steps"] == 2 and r["reward_model_scored_by"] == "shared_base"
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in logged if "rewards/reward_model/mean" in s] == [1, 2]  # scored every step
    reward = [n for n in watch.before if f".{ADAPTER_NAME}." in n]
    policy = [n for n in watch.before if ".default." in n]
    assert reward and policy
    assert all(torch.equal(watch.before[n], watch.after[n]) for n in reward)
    assert watch.trainable == set(policy)  # after steps with the adapter-off reference pass: the policy's alone
    assert any(not torch.equal(watch.before[n], watch.after[n]) for n in policy)
    assert isinstance(r["eval"]["eval_reward_model"], float)  # the held-out greedy completions, scored the same way
    assert (tmp_path / "adapter" / "adapter_config.json").is_file() and not (tmp_path / "adapter" / "reward").exists()


def test_a_missing_reward_adapter_is_a_clear_error(tmp_path, tiny_model):
    (tmp_path / "model").mkdir()
    with pytest.raises(ValueError, match=r"stages\.rloo\.reward_shared_base: the rm stage's output .* has no reward "
                                         r"adapter \(adapter_config\.json, .* missing .*Rerun rm"):
        reward_adapter_for(str(tmp_path / "model"), str(tiny_model), "rloo")


def test_a_bf16_base_with_fp32_adapters_scores_without_autocast(tiny_model, lora_rm):
    """The GPU layout (bf16 base, PEFT's fp32 adapters, Bf16LoraInputs' input cast off) scored outside the
    Trainer's autocast, as TRL calls reward functions: PEFT's mixed batch casts the inputs; bf16-close to the merged
    model in bf16 (0.007 apart here, on scores from -0.7 to 1.1)."""
    from peft import get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    base = models.load_causal_lm(tiny_model, "bf16", "lora")
    model = get_peft_model(base, models.lora_config(LoraConfig(rank=8, alpha=16), "CAUSAL_LM", base))
    scorer = SharedBaseScore(reward_adapter_for(lora_rm["output_model"], str(tiny_model), "rloo"),
                             lora_rm["output_model"])
    scorer.attach(model)
    assert scorer.head.weight.dtype == torch.float32  # the head in fp32 on the bf16 base's hidden states
    assert {p.dtype for n, p in model.named_parameters() if f"lora_A.{ADAPTER_NAME}" in n} == {torch.float32}
    for layer in model.modules():
        if isinstance(layer, BaseTunerLayer):
            layer.cast_input_dtype_enabled = False
    merged = RewardModelScore(lora_rm["output_model"])
    merged._load()
    merged._model.to(torch.bfloat16)
    assert scorer(PROMPTS, COMPLETIONS) == pytest.approx(merged(PROMPTS, COMPLETIONS), abs=2e-2)
