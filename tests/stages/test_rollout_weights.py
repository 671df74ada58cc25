"""A rollout changes no weight (issue 35 item 2): through one real grpo step on the tiny model, every parameter's dtype
and value when the step begins equal those just before the optimizer step (between them ran the rollout: sampling,
the reward and log-prob passes, the reference's with LoRA's adapter off, and forward and backward, which write
gradients only), and after the optimizer step every dtype is unchanged and the frozen base is bit-identical. What a
faster rollout may do wrong (issue 35: TRL's continuous-batching path casts the model to bf16 for good; an in-place
LoRA merge in bf16 drifts the base) fails here. Cases: LoRA on a bf16 base (PEFT's fp32 adapters) and full training
in amp-bf16 (fp32 master weights), both under bf16 autocast as on a GPU. The LoRA case generates on the merged
weights (trainer_kit/merged_rollouts.py, the plan's `rollout`): a hook sees the merge during the rollout."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from medgpt_ray.stages import build_stage
from tests.stages.test_grpo_stage import grpo_inputs, prompts  # noqa: F401  (the prompts fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py
Snapshot = dict[str, tuple[torch.dtype, bool, torch.Tensor]]


def snapshot(model: Any) -> Snapshot:
    """Every parameter: (dtype, trainable, a copy of its value)."""
    return {n: (p.dtype, p.requires_grad, p.detach().clone()) for n, p in model.named_parameters()}


def changed(before: Snapshot, after: Snapshot, frozen_only: bool = False) -> list[str]:
    """Parameters whose dtype changed, or whose value is not bit-identical (of the frozen ones only, if asked)."""
    assert before.keys() == after.keys()
    return [n for n, (dtype, trainable, value) in before.items()
            if after[n][0] != dtype or (not (frozen_only and trainable) and not torch.equal(after[n][2], value))]


class WeightsAroundTheRollout(TrainerCallback):
    """The model's parameters when each step begins, before its optimizer step and after it."""

    def __init__(self) -> None:
        self.seen: list[tuple[Snapshot, Snapshot, Snapshot]] = []
        self.begin = self.before_step = None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.begin = snapshot(model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.before_step = snapshot(model)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.seen.append((self.begin, self.before_step, snapshot(model)))


def merge_watch(model: Any) -> list[int]:
    """Forwards of the first LoRA layer that ran with its adapter merged (appended to the list returned)."""
    from peft.tuners.lora import LoraLayer

    seen: list[int] = []
    for m in model.modules():
        if isinstance(m, LoraLayer):
            m.register_forward_pre_hook(lambda module, args: seen.append(1) if module.merged else None)
            break
    return seen


@pytest.mark.parametrize(("method", "precision", "beta", "path"), [
    ("lora", "bf16", 0.04, "dynamic"), ("full", "amp-bf16", 0.0, "dynamic"),
    ("lora", "bf16", 0.04, "static")])  # the static decode path (trainer_kit/static_rollouts.py) on merged weights
def test_a_grpo_rollout_keeps_every_weight_and_its_dtype(prompts, tiny_model, tmp_path, method, precision,  # noqa: F811
                                                         beta, path):
    torch.manual_seed(0)
    inp = grpo_inputs(prompts, tiny_model, tmp_path, method=method, max_steps=1, effective_batch=4,
                      max_completion_length=6, reward_funcs=["format", "length"], beta=beta, generation_path=path)
    inp = replace(inp, plan=replace(inp.plan, precision=precision))  # the GPU's precision, on CPU
    trainer = build_stage(inp).trainer
    assert trainer.args.bf16  # the Trainer's bf16 autocast
    recorder = WeightsAroundTheRollout()
    trainer.add_callback(recorder)
    merged_forwards = merge_watch(trainer.model)
    with torch.no_grad():  # a trained adapter: PEFT starts B at zero, whose merge would change nothing
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    trainer.train()
    assert inp.plan.rollout.startswith("merged" if method == "lora" else "the trained weights")
    assert inp.plan.generation_path == path and (path == "static") == hasattr(trainer, "static_decoder")
    assert bool(merged_forwards) == (method == "lora")  # the rollout decoded on merged weights
    assert len(recorder.seen) == 1
    assert path == "dynamic" or trainer.static_decoder.builds == 1  # the rollout ran on the static path
    begin, before_step, after_step = recorder.seen[0]
    dtypes = {dtype for dtype, trainable, _ in begin.values() if trainable}
    assert dtypes == {torch.float32}  # what trains is fp32: PEFT's adapters, amp's master weights
    if method == "lora":
        assert {dtype for dtype, trainable, _ in begin.values() if not trainable} == {torch.bfloat16}
    assert not changed(begin, before_step)  # the rollout (and forward, backward) changed nothing
    assert not changed(begin, after_step, frozen_only=True)  # the optimizer step: trainable values only
