"""Do compiled decoder layers recompile on variable-length batches, and what do bucketed lengths change?

A LoRA DPO step's shape of work on Qwen2.5-1.5B-shaped decoder layers (random init, bf16, 4 layers, the first two
checkpointed as a selective plan does, each layer compiled in place as stages/speed.py does): per step an
adapter-off no-grad reference pass and a training pass with backward over 8 rows of one random length in
200-1,024 tokens (some rows padded), an evaluation pass after step 10. `--lengths bucket` rounds each length up
to a multiple of 128 (stages/trainer_args.py BUCKET). Prints one JSON line per step: seconds, and dynamo's
compiled-graph count (what stages/speed.py RecompileCount reads). `--recompile-limit 0` runs uncompiled.
Plain torch + transformers + peft, so it runs on the GPU image as it is:

    for a in "bucket 0" "bucket 8" "bucket 32" "raw 32"; do set -- $a
      python bench/compile_shapes_probe.py --lengths $1 --recompile-limit $2; done
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", choices=["raw", "bucket"], default="bucket")
    ap.add_argument("--recompile-limit", type=int, default=32, help="dynamo's recompile_limit; 0: no compile")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM, Qwen2Config
    from transformers.modeling_layers import GradientCheckpointingLayer

    random.seed(0)
    torch._dynamo.config.recompile_limit = max(args.recompile_limit, 1)
    shape = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=args.layers,
                        num_attention_heads=12, num_key_value_heads=2, vocab_size=32000)
    model = AutoModelForCausalLM.from_config(shape, dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable({"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM")).train()
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers[len(layers) // 2 :]:
        layer.gradient_checkpointing = False  # a selective plan: the first half recompute, the rest keep activations
    for layer in layers:
        if args.recompile_limit:
            layer.compile()

    def forward(ids, mask, **kw):
        return model(input_ids=ids, attention_mask=mask, use_cache=False, **kw)

    for step in range(args.steps):
        length = random.randint(200, 1024)
        if args.lengths == "bucket":
            length = -(-length // 128) * 128
        ids = torch.randint(0, 32000, (8, length), device="cuda")
        mask = torch.ones_like(ids)
        mask[1:, length - random.randint(1, 150) :] = 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad(), model.disable_adapter():  # DPO's reference: the adapter-off policy
            forward(ids, mask)
        forward(ids, mask, labels=ids).loss.backward()
        if step == 10:
            model.eval()
            with torch.no_grad():
                forward(ids, mask)
            model.train()
        torch.cuda.synchronize()
        print(json.dumps({"lengths": args.lengths, "recompile_limit": args.recompile_limit, "step": step,
                          "length": length, "seconds": round(time.perf_counter() - t0, 3),
                          "graphs": int(counters["stats"]["unique_graphs"])}), flush=True)


if __name__ == "__main__":
    main()
