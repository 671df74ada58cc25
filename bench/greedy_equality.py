"""Greedy answers of the static decode path against transformers' generate, token by token (issue 47's correctness
target): equal in fp32 (the CPU tests hold that: tests/stages/test_hybrid_decode.py); in bf16 on a GPU equal up to
the first near-tie, reported. A near-tie: at the first step where a row's tokens differ, the reference's logits of
the two tokens are within --near-tie of each other (bf16's logits are rounded to 2^-8 of their magnitude, so two
kernels' sums may pick either of two tied tokens; anything wider is a real difference).

The reference is generate's dynamic path with its per-step logits (output_logits); ours is generation/decode_path's
StaticDecoder (the static cache, compiled with CUDA graphs on a GPU), as `generate`, grpo's rollouts and opd's
samples run it. Prompts are random token ids of --prompt-len, every other row left-padded by a quarter.

--control also runs generate on each row alone (batch 1, its padding dropped) and compares it with generate's batched
answers the same way: how often generate disagrees with itself when only the batch changes the kernels' rounding.
Each divergence also gives its gap in steps of its dtype at the reference logit (`gap_steps`; bf16 keeps 8 bits of
mantissa, so at logits ~3 a step is 0.0156: a gap under 1e-3 there is an exact tie).

    python3 bench/greedy_equality.py --model qwen3.5-0.8b --out $OUT/greedy_equality.json     # GPU, bf16
    .venv/bin/python bench/greedy_equality.py --model-dir DIR --dtype fp32 --batch 2 --new-tokens 8 --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def prompts(vocab: int, batch: int, length: int, device: str) -> tuple[Any, Any]:
    import torch

    ids = torch.randint(5, vocab, (batch, length), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1::2, : length // 4] = 0  # every other row left-padded
    return ids.to(device), mask.to(device)


def first_divergence(want: Any, got: Any, logits: list[Any], start: int, near_tie: float) -> list[dict[str, Any]]:
    """Per row: equal, or the first new-token step where the tokens differ, with the reference's logits of both
    tokens there and whether they are a near-tie."""
    rows = []
    for r in range(want.shape[0]):
        diff = (want[r, start:] != got[r, start:]).nonzero()
        if diff.numel() == 0:
            rows.append({"row": r, "equal": True})
            continue
        k = int(diff[0])
        step = logits[k][r].float()
        a, b = int(want[r, start + k]), int(got[r, start + k])
        gap = float(step[a] - step[b])
        rows.append({"row": r, "equal": False, "step": k, "reference_token": a, "our_token": b,
                     "reference_logit": round(float(step[a]), 5), "logit_gap": round(gap, 6),
                     "gap_steps": round(abs(gap) / dtype_step(logits[k].dtype, float(step[a])), 2),
                     "near_tie": abs(gap) < near_tie})
    return rows


def dtype_step(dtype: Any, value: float) -> float:
    """The spacing of `dtype`'s numbers at `value` (its unit in the last place)."""
    import math

    import torch

    mantissa = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}.get(dtype, 23)
    return 2.0 ** (math.floor(math.log2(max(abs(value), 1e-30))) - mantissa)


def alone(model: Any, ids: Any, mask: Any, kw: dict[str, Any]) -> Any:
    """generate on each row by itself, its left padding dropped, re-padded on the left to the batch's width."""
    import torch

    out = []
    for r in range(ids.shape[0]):
        keep = mask[r].bool()
        seq = model.generate(ids[r:r + 1, keep], attention_mask=mask[r:r + 1, keep], **kw)
        pad = ids.shape[1] - int(keep.sum())
        out.append(torch.cat([ids[r, :pad], seq[0]]))
    return torch.stack(out)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    diverged = [r for r in rows if not r["equal"]]
    return {"rows_equal": len(rows) - len(diverged), "rows_diverged": len(diverged),
            "all_divergences_near_ties": all(r["near_tie"] for r in diverged),
            "gap_steps": sorted(r["gap_steps"] for r in diverged)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3.5-0.8b", help="a bench/family_models.py preset (random weights)")
    ap.add_argument("--model-dir", type=Path, help="a model directory instead")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--near-tie", type=float, default=1e-3)
    ap.add_argument("--control", action="store_true", help="also generate each row alone against generate batched")
    ap.add_argument("--work", type=Path, default=Path("/tmp/greedy_equality"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import torch

    from medgpt_ray import models
    from medgpt_ray.generation.decode_path import StaticDecoder
    from medgpt_ray.tiny import ensure_tiny

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.model_dir is None:
        from family_models import prepare_family_model

        a.model_dir = prepare_family_model(a.model, a.work / "models", ensure_tiny())
    model = models.load_causal_lm(a.model_dir, "bf16" if a.dtype == "bf16" else "fp32", "full").to(device).eval()
    ids, mask = prompts(model.config.vocab_size, a.batch, a.prompt_len, device)
    kw = {"max_new_tokens": a.new_tokens, "min_new_tokens": a.new_tokens, "do_sample": False,
          "pad_token_id": model.config.pad_token_id or 0}
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True, **kw)
        decoder = StaticDecoder(a.prompt_len + a.new_tokens)
        ours = decoder.generate(model, ids, attention_mask=mask, **kw)
        single = alone(model, ids, mask, kw) if a.control else None
    rows = first_divergence(ref.sequences, ours, list(ref.logits), a.prompt_len, a.near_tie)
    doc = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "model": str(a.model_dir), "dtype": a.dtype, "batch": a.batch, "prompt_len": a.prompt_len,
           "new_tokens": a.new_tokens, "near_tie": a.near_tie, **summary(rows), "decoder": decoder.stats(),
           "rows": rows}
    if single is not None:  # generate against itself: the same rows, only the batch differs
        control = first_divergence(ref.sequences, single, list(ref.logits), a.prompt_len, a.near_tie)
        doc["control_generate_alone"] = {**summary(control), "rows": control}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("rows", "control_generate_alone")}, indent=1))
    if single is not None:
        print("control (generate alone):", json.dumps({k: v for k, v in doc["control_generate_alone"].items()
                                                        if k != "rows"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
