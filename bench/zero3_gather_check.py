"""Check memory/zero3.py's replay of ZeRO-3's parameter gathering against DeepSpeed's own coordinator.

DeepSpeed's fetch/prefetch/release decisions do not depend on the device or the number of ranks, so they are
observed here on the CPU in one process: a small random-init model (a Qwen3-MoE with fused experts, and a dense
Qwen2 with tied embeddings) trained for a few steps under ZeRO-3 with settings scaled to its size, recording after
every fetch the elements of the parameters DeepSpeed holds gathered (not persistent, status not NOT_AVAILABLE), and
counting the elements it gathers per step. The replay is given the same settings and the shape read from the same
config; both numbers must agree.

    PYTHONPATH=. python bench/zero3_gather_check.py --out bench/results/zero3_gather_check_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MOE = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, tie_word_embeddings=False)
DENSE = dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
SHARED = dict(model_type="qwen2_moe", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=96, tie_word_embeddings=False)
HYBRID = dict(model_type="qwen3_5_moe_text", vocab_size=512, hidden_size=64, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=False,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
CASES: dict[str, dict[str, Any]] = {"qwen3_moe": {"config": MOE, "ckpt": False},
                                    "qwen3_moe-ckpt": {"config": MOE, "ckpt": True},
                                    "qwen2-tied": {"config": DENSE, "ckpt": False},
                                    "qwen2-tied-ckpt": {"config": DENSE, "ckpt": True},
                                    "qwen2_moe-shared-ckpt": {"config": SHARED, "ckpt": True},
                                    "qwen3_5_moe_text-ckpt": {"config": HYBRID, "ckpt": True},
                                    "qwen2-tied-ckpt-lora": {"config": DENSE, "ckpt": True, "lora": True},
                                    "qwen3_moe-ckpt-lora": {"config": MOE, "ckpt": True, "lora": True}}
# LoRA (PEFT) on the layers' projections: attention and dense MLP, not the router, experts or heads (a fused
# experts' `down_proj` is a parameter: naming it would wrap the experts instead).
LORA_RANK = 4
LORA_TARGETS = {"qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"]}
# Scaled to a ~0.3 M-parameter model as DeepSpeed's planned settings are to billions: a prefetch bucket of about
# one projection, a live limit and reuse distance of a fraction of the model; then a second mix (a bucket larger
# than the live limit, a short reuse distance) so that each setting decides somewhere. Both keep Qwen3.5's conv1d
# weight (512 elements here, 32 k in the real models: under the planned threshold of 1e5) persistent: it is used
# outside its module's call, which the trace does not model.
POLICIES = {"scaled": dict(prefetch_bucket=6000, max_live=60000, persistence_threshold=600, max_reuse_distance=40000),
            "tight": dict(prefetch_bucket=30000, max_live=20000, persistence_threshold=3000, max_reuse_distance=5000)}


def measure(case: dict[str, Any], policy: dict[str, int], steps: int) -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers as tf
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    cfg = dict(case["config"])
    config = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config)
    if case["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case.get("lora"):
        import peft

        model.enable_input_require_grads()
        targets = LORA_TARGETS[case["config"]["model_type"]]
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_RANK, target_modules=targets, lora_dropout=0.05))
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": policy["prefetch_bucket"],
                                "stage3_max_live_parameters": policy["max_live"],
                                "stage3_param_persistence_threshold": policy["persistence_threshold"],
                                "stage3_max_reuse_distance": policy["max_reuse_distance"]}}
    trained = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(trained, lr=0.0), config=ds)
    coord = engine.optimizer.parameter_offload.get_param_coordinator()
    params = [p for p in engine.module.parameters() if not p.ds_persist]
    record: dict[str, Any] = {"peak": 0, "gathered": 0, "before": set()}

    def available() -> set[int]:
        return {i for i, p in enumerate(params) if p.ds_status != ZeroParamStatus.NOT_AVAILABLE}

    fetch, release = coord.fetch_sub_module, coord.release_sub_module

    def fetch_and_record(module, forward):  # observation only: DeepSpeed's own call, then what it holds
        fetch(module, forward)
        now = available()
        record["gathered"] += sum(params[i].ds_numel for i in now - record["before"])
        record["peak"] = max(record["peak"], sum(params[i].ds_numel for i in now))
        record["before"] = now

    def release_and_record(module, forward=False):
        release(module, forward)
        record["before"] = available()

    coord.fetch_sub_module, coord.release_sub_module = fetch_and_record, release_and_record
    ids = torch.randint(0, config.vocab_size, (1, 32))
    per_step = []
    for _ in range(steps):
        record.update(peak=0, gathered=0, before=available())
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        per_step.append({"peak_elements": record["peak"], "gathered_elements": record["gathered"]})
    return {"per_step": per_step, "params": sum(p.ds_numel for p in engine.module.parameters()),
            "partitioned": sum(p.ds_numel for p in params)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--steps", type=int, default=4, help="steps; DeepSpeed's trace is complete from the third")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    a = ap.parse_args()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}.items():
        os.environ.setdefault(key, value)
    warnings.simplefilter("ignore")
    import deepspeed
    import transformers

    from medgpt_ray.memory.shapes import shape_from_config
    from medgpt_ray.memory.zero3 import Policy, gathered

    results = {}
    for pname, policy in POLICIES.items():
        for name, case in CASES.items():
            if a.only not in name:
                continue
            shape = shape_from_config(case["config"], name)
            measured = measure(case, policy, a.steps)
            lora = case.get("lora", False)
            replay = gathered(shape, shape.layers if case["ckpt"] else 0, True, Policy(**policy), LORA_RANK * lora)
            replayed = {"peak_elements": replay.peak_elements, "gathered_elements": replay.per_micro_batch}
            results[f"{name}/{pname}"] = {**measured, "policy": pname, "config": case["config"], "ckpt": case["ckpt"],
                                          "lora_rank": LORA_RANK * lora,
                                          "replay": replayed, "shape_params": shape.params,
                                          "agree": measured["per_step"][-1] == replayed}
    doc = {"command": "PYTHONPATH=. python bench/zero3_gather_check.py" + (f" --out {a.out}" if a.out else ""),
           "policies": POLICIES,
           "versions": {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__},
           "cases": results}
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
