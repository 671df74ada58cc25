"""The planned checkpointing fraction holds through a DPO stage's steps (trainer_kit/checkpointing.py): TRL's DPO
switches checkpointing off and on again for every layer around its reference pass, every micro-batch; the policy's
forward of every micro-batch must still checkpoint exactly the first `ckpt_fraction` of the decoder layers. The same
through a GRPO stage, whose rollout (inside the micro-batch) switches every layer back on after generating."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import TrainerCallback

from medgpt_ray.stages import build_stage
from medgpt_ray.trainer_kit.checkpointing import SelectiveCheckpointing, decoder_layers
from tests.stages.test_alignment_stages import inputs, pairs  # noqa: F401  (the pairs fixture)
from tests.stages.test_grpo_stage import grpo_inputs, prompts  # noqa: F401  (the prompts fixture)

STEPS, ACCUM = 3, 2


class _Recorder(TrainerCallback):
    """Which decoder layers checkpoint in each micro-batch's training forward (grad on, training mode: the policy's
    forward, not the reference pass under no_grad), and each layer's flag when a step ends."""

    def __init__(self, layers: list):
        self.micro_batches: list[set[int]] = []
        self.current: set[int] = set()
        self.at_step_end: list[list[bool]] = []
        self.layers = layers
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(lambda module, args, i=i: self._seen(module, i))

    def _seen(self, module, i: int) -> None:
        if module.training and torch.is_grad_enabled() and module.gradient_checkpointing:
            self.current.add(i)

    def _close(self) -> None:
        self.micro_batches.append(self.current)
        self.current = set()

    def on_substep_end(self, args, state, control, **kwargs):
        self._close()

    def on_step_end(self, args, state, control, **kwargs):
        self._close()
        self.at_step_end.append([layer.gradient_checkpointing for layer in self.layers])


def test_half_the_layers_checkpoint_in_every_micro_batch_of_a_dpo_stage(pairs, tiny_model, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    inp = inputs("dpo", pairs, tiny_model, tmp_path, max_steps=STEPS, effective_batch=2 * ACCUM, micro_batch=2)
    inp = replace(inp, plan=replace(inp.plan, ckpt_fraction=0.5))
    built = build_stage(inp)
    trainer = built.trainer
    assert any(isinstance(c, SelectiveCheckpointing) for c in trainer.callback_handler.callbacks)
    assert trainer.args.gradient_accumulation_steps == ACCUM
    layers = decoder_layers(trainer.model)
    assert len(layers) == 2
    recorder = _Recorder(layers)
    trainer.add_callback(recorder)
    trainer.train()
    assert len(recorder.micro_batches) == STEPS * ACCUM
    # The first half of the layers, and only it, in every micro-batch of every step.
    assert recorder.micro_batches == [{0}] * (STEPS * ACCUM)
    # Why the callback switches the flag before every micro-batch: TRL's reference pass left every layer on.
    assert recorder.at_step_end == [[True, True]] * STEPS


def test_half_the_layers_checkpoint_in_every_micro_batch_of_a_grpo_stage(prompts, tiny_model, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    inp = grpo_inputs(prompts, tiny_model, tmp_path, grad_ckpt=True, max_steps=2, effective_batch=4,
                      max_completion_length=4, reward_funcs=["length"], beta=0.0)
    inp = replace(inp, plan=replace(inp.plan, ckpt_fraction=0.5))
    trainer = build_stage(inp).trainer
    recorder = _Recorder(decoder_layers(trainer.model))
    trainer.add_callback(recorder)
    trainer.train()
    forwards = [m for m in recorder.micro_batches if m]
    assert forwards and forwards == [{0}] * len(forwards)
