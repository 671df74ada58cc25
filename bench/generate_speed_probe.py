"""Why the RL stages' sampling is slow (issue 18): HF generate tokens/s of one model in the configurations a GRPO or
RLOO worker generates with, one change at a time: the plain model; with a LoRA adapter on every linear layer (as
models.lora_config's defaults, PEFT's per-module Python); with Liger's kernels applied (use_liger_kernel, as the
planner's fused_kernels); both; and the model in train() mode (TRL generates from the training model). Each is one
warm-up call and one timed call of --batch sampled sequences of --new-tokens tokens (min_new_tokens: no early stop)
after a --prompt-len prompt, on CUDA.

    python3 bench/generate_speed_probe.py --model-dir /tmp/medgpt-rsr/models/qwen2.5-1.5b --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def timed_generate(model, batch: int, prompt_len: int, new_tokens: int) -> float:
    import torch

    ids = torch.randint(100, 20_000, (batch, prompt_len), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0,
              attention_mask=torch.ones_like(ids), pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    rows = []

    def measure(name: str, model) -> None:
        tps = timed_generate(model, a.batch, a.prompt_len, a.new_tokens)
        rows.append({"config": name, "new_tokens_per_s": round(tps, 1),
                     "ms_per_decode_step": round(1000 * a.batch / tps, 1)})
        print(json.dumps(rows[-1]), flush=True)

    def fresh():
        return AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16).cuda().eval()

    measure("plain, eval", fresh())
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    measure("lora all-linear, eval", get_peft_model(fresh(), lora))
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        _apply_liger_kernel_to_instance = None
    if _apply_liger_kernel_to_instance:
        m = fresh()
        _apply_liger_kernel_to_instance(model=m)
        measure("liger, eval", m)
        m = fresh()
        _apply_liger_kernel_to_instance(model=m)
        m = get_peft_model(m, lora)
        measure("liger + lora, eval", m)
        m.train()
        measure("liger + lora, train()", m)
    out = Path(a.out) / "generate_speed_probe.json"
    out.write_text(json.dumps({"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                               "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                               "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
