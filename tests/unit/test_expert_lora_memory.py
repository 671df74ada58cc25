"""Issue 34 item 2, `lora.experts` in the memory model: PEFT folds the expert adapters into a copy of each routed
layer's whole expert weights on every forward (memory/expert_lora.py). Torch's MemTracker traces a real forward and
backward of a tiny Qwen3-MoE (bf16, CPU, transformers' default grouped_mm experts) with and without the key; the
estimator's difference must cover the traced one, within 40 %, and fall short of it without the fold term.

FakeTensorMode (no memory at all) is not used: PEFT's adapter placement (`module.to`) cannot swap fake parameters;
the model is small enough to run for real (a few MB)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from medgpt_ray.config import LoraConfig
from medgpt_ray.memory.estimator import TrainSetup, estimate
from medgpt_ray.memory.shapes import shape_from_config
from medgpt_ray.models import lora_config

RANK, TOKENS, VOCAB = 2, 16, 128
# The experts dominate: 16 experts of 128 on hidden 64, so one routed layer's experts (393 k weights) outweigh its
# activations at 16 tokens, as on a real MoE at any sequence length (Qwen3-30B-A3B: 1.2 GiB of experts a layer).
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=128)


def traced_peak(experts: bool, checkpointing: bool) -> int:
    """The most bytes alive on the CPU during one forward and backward of the LoRA model the stages build."""
    from peft import get_peft_model
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        # MemTracker hooks every module's parameters for their gradients; a frozen one cannot take a hook.
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(tf.Qwen3MoeConfig(**CONFIG), dtype=torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, lora_config(LoraConfig(rank=RANK, dropout=0.0, experts=experts), "CAUSAL_LM", model))
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    tracker = Tracker()
    tracker.track_external(model.train())
    with tracker:
        model(input_ids=ids, labels=ids).loss.backward()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("ckpt", [0.0, 1.0], ids=["no-ckpt", "full-ckpt"])
def test_the_planned_extra_of_expert_adapters_covers_the_traced_one(ckpt):
    traced = traced_peak(True, bool(ckpt)) - traced_peak(False, bool(ckpt))
    shape = shape_from_config(tf.Qwen3MoeConfig(**CONFIG).to_dict(), "tiny-moe")
    setup = dict(stage="sft", method="lora", precision="bf16", micro_batch=1, seq_len=TOKENS, ckpt_fraction=ckpt,
                 lora_rank=RANK)
    on, off = estimate(shape, TrainSetup(**setup, lora_experts=True)), estimate(shape, TrainSetup(**setup))
    assert on.moment == off.moment == "backward start"
    extra = {k: v - off.breakdown.get(k, 0) for k, v in on.breakdown.items() if v != off.breakdown.get(k, 0)}
    # The optimizer's states exist from the first step on; one traced pass creates none: left out of the comparison.
    assert set(extra) == {"weights", "optimizer_states", "expert_lora_fold"}
    predicted = extra["weights"] + extra["expert_lora_fold"]
    assert traced <= predicted <= 1.4 * traced, (traced, extra)
    assert predicted - extra["expert_lora_fold"] < traced  # the fold is the term that covers it
