"""Issue 34 item 2, `lora.experts` through the sft stage as a pipeline runs it (planner, stage build, TRL, save and
merge), in a plain process on a tiny random Qwen3-MoE: two optimizer steps move the expert adapters and leave the
base experts and the router bit-identical; the merged model answers as the base with the saved adapter does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import LoraConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import load_shape
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py


@pytest.fixture(scope="module")
def tiny_moe(tiny_model, tmp_path_factory) -> Path:
    """A random Qwen3-MoE (2 layers, 4 experts of 16, 2 routed) with the tiny tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    tok = models.load_tokenizer(tiny_model)
    cfg = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=16, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen3_moe")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


class Snapshots(TrainerCallback):
    """The trained model's parameters when training begins and ends."""

    def __init__(self) -> None:
        self.begin: dict[str, torch.Tensor] = {}
        self.end: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.begin = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.end = {n: p.detach().clone() for n, p in model.named_parameters()}


def test_sft_with_lora_experts_trains_the_expert_adapters_and_merges_them(repo, tiny_moe, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path / "data", 0.1,
                        max_records=8)
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=4, alpha=8, dropout=0.0, experts=True), lr=1e-2,
                      max_steps=2, seq_len=128, effective_batch=2, logging_steps=1, save_steps=100)
    plan = plan_stage("sft", cfg, 1, False, shape=load_shape(str(tiny_moe)))
    snaps = Snapshots()
    result = run_stage(StageInputs("sft", cfg, plan, str(tiny_moe), "chatml", data.train_file, data.eval_file,
                                   str(tmp_path / "sft")), callbacks=[snaps])
    assert result["steps"] == 2

    adapters = [n for n in snaps.begin if ".mlp.experts." in n and ".lora_" in n]
    assert len(adapters) == 2 * 2 * 2  # 2 layers x (gate_up, down) x (A, B)
    assert all(not torch.equal(snaps.begin[n], snaps.end[n]) for n in adapters if ".lora_B." in n)
    # Nested ParamWrappers (one per fused tensor): the experts' own weights sit under base_layer.base_layer.
    base = [n for n in snaps.begin if n.endswith(("base_layer.gate_up_proj", "base_layer.down_proj",
                                                  "mlp.gate.weight"))]
    assert len(base) == 3 * 2  # gate_up, down and the router, in each layer
    assert all(torch.equal(snaps.begin[n], snaps.end[n]) for n in base)

    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(result["output_model"], local_files_only=True)(ids).logits
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_moe, local_files_only=True),
                                            tmp_path / "sft" / "adapter")(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_moe, local_files_only=True)(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-4) and not torch.allclose(merged, plain, atol=1e-4)
