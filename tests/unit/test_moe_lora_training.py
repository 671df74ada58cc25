"""Issue 34 item 2: LoRA with our default settings (all-linear, dropout 0.05) on a real tiny Qwen3-MoE (random init,
CPU) builds, trains an optimizer step, and leaves the router and the routed experts as they were (PEFT's own
`all-linear` refused dropout there, config/lora_targets.py)."""

from __future__ import annotations

import torch
import transformers as tf

from medgpt_ray.config import LoraConfig
from medgpt_ray.models import lora_config


def tiny_qwen3_moe():
    torch.manual_seed(0)
    cfg = tf.Qwen3MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=16)
    return tf.AutoModelForCausalLM.from_config(cfg)


def test_lora_on_a_qwen3_moe_trains_one_step_with_router_and_experts_unchanged():
    from peft import get_peft_model

    model = tiny_qwen3_moe()
    lora = LoraConfig()
    assert lora.dropout == 0.05 and lora.targets == "all-linear"  # the defaults that PEFT's all-linear refused
    peft = get_peft_model(model, lora_config(lora, "CAUSAL_LM", model))
    frozen = {n: p.detach().clone() for n, p in peft.named_parameters() if ".mlp." in n}
    assert any(n.endswith("mlp.gate.weight") for n in frozen) and any("experts.gate_up_proj" in n for n in frozen)
    assert not any(p.requires_grad for n, p in peft.named_parameters() if ".mlp." in n)
    adapters = {n: p.detach().clone() for n, p in peft.named_parameters() if p.requires_grad}
    assert adapters and all(".self_attn." in n and ".lora_" in n for n in adapters)

    optim = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=1e-2)
    peft.train()
    ids = torch.randint(0, 256, (2, 16))
    loss = peft(input_ids=ids, labels=ids).loss
    loss.backward()
    optim.step()

    params = dict(peft.named_parameters())
    assert all(torch.equal(params[n], before) for n, before in frozen.items())
    changed = [n for n, before in adapters.items() if not torch.equal(params[n], before)]
    # lora_B starts at zero and carries the loss's gradient on the first step: every one of them moved.
    assert {n for n in adapters if ".lora_B." in n} <= set(changed)
