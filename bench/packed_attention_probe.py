"""Where an RM step's time goes on real-length pairs, padded vs packed, SDPA vs flex attention (issue 15: "the gap
explained with a profile").

The reward model's backbone (Qwen2.5 shape, random bf16 weights, no LoRA: attention and MLP cost the same) runs
forward + backward on one step's worth of real-length sequences, three ways:

  padded       micro-batches of `--micro-batch` pairs (2 x that many sequences), length-sorted as the stage's
               length-grouped sampler does, each padded to its longest sequence
  packed-sdpa  the same sequences packed best-fit-decreasing into rows of 2 x seq_len, position ids restarting per
               sequence: SDPA gets the block-diagonal mask as a dense (row x row) mask and computes every block
  packed-flex  the same rows with attn_implementation flex_attention: a BlockMask, masked blocks skipped

Sequence lengths are the pairs' token lengths of bench/make_real_length_corpus.py's preference set, measured by
--lengths-from (the stage's plan.json `lengths` of a real_length_throughput run) or drawn from its documented
distribution (--synthetic). Per variant: the median step time of --repeats, non-padding tokens/s, and a
torch.profiler table of the top CUDA kernels by time (attention kernels vs the rest).

    python3 bench/packed_attention_probe.py --model qwen2.5-1.5b --out $OUT   (GPU machine, about two minutes)

Measured on the H200: bench/results/packed_attention_probe_1.5b_h200.json (bench/README.md reads it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]


def pair_lengths(n_pairs: int, seq_len: int, seed: int) -> list[int]:
    """Sequence lengths (prompt + answer, capped at seq_len) of make_real_length_corpus's preference pairs: prompts
    p50 51 tokens (33-87), answers 239-1,475 (p50 517, p90 1,186), measured in bench/results'
    real_length_throughput runs' corpus summary; the answer drawn log-uniformly between its p10 and p99."""
    import math

    rng = random.Random(seed)
    out = []
    for _ in range(2 * n_pairs):
        prompt = rng.randint(33, 87)
        answer = int(math.exp(rng.uniform(math.log(239), math.log(1475))))
        out.append(min(prompt + answer, seq_len))
    return out


def pack(lengths: list[int], row: int) -> list[list[int]]:
    """Best-fit decreasing: rows of at most `row` tokens."""
    rows: list[list[int]] = []
    free: list[int] = []
    for n in sorted(lengths, reverse=True):
        best = min((i for i, f in enumerate(free) if f >= n), key=lambda i: free[i], default=None)
        if best is None:
            rows.append([n])
            free.append(row - n)
        else:
            rows[best].append(n)
            free[best] -= n
    return rows


def batches(lengths: list[int], variant: str, mb: int, seq_len: int, device: str) -> list[dict[str, Any]]:
    import torch

    out = []
    if variant == "padded":
        ordered = sorted(lengths)
        for i in range(0, len(ordered), 2 * mb):
            chunk = ordered[i:i + 2 * mb]
            width = max(chunk)
            mask = torch.tensor([[1] * n + [0] * (width - n) for n in chunk], device=device)
            ids = torch.randint(3, 1000, (len(chunk), width), device=device) * mask
            out.append({"input_ids": ids, "attention_mask": mask, "tokens": sum(chunk), "slots": width * len(chunk)})
        return out
    rows = pack(lengths, 2 * seq_len)
    for i in range(0, len(rows), mb):  # the stage's micro-batch of packed rows, each padded to 2 x seq_len
        chunk = rows[i:i + mb]
        pos = torch.stack([torch.cat([torch.arange(n) for n in row] + [torch.arange(2 * seq_len - sum(row))])
                           for row in chunk]).to(device)
        ids = torch.randint(3, 1000, pos.shape, device=device)
        out.append({"input_ids": ids, "position_ids": pos, "tokens": sum(map(sum, chunk)),
                    "slots": 2 * seq_len * len(chunk)})
    return out


def step(model: Any, batch_list: list[dict[str, Any]]) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in batch_list:
        kw = {k: v for k, v in b.items() if k in ("input_ids", "attention_mask", "position_ids")}
        hidden = model(**kw).last_hidden_state
        hidden.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def kernel_table(model: Any, batch_list: list[dict[str, Any]], top: int = 12) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, batch_list)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
    total = sum(getattr(e, "self_device_time_total", 0) for e in events) or 1
    rows = sorted(events, key=lambda e: -getattr(e, "self_device_time_total", 0))[:top]
    out = [{"kernel": e.key[:120], "ms": round(e.self_device_time_total / 1e3, 2),
            "share": round(e.self_device_time_total / total, 3)} for e in rows]
    attention = sum(e.self_device_time_total for e in events
                    if any(k in e.key.lower() for k in ("flash", "attention", "fmha", "sdpa", "flex", "triton_tem")))
    out.append({"kernel": "ATTENTION (flash/fmha/sdpa/flex kernels)", "ms": round(attention / 1e3, 2),
                "share": round(attention / total, 3)})
    return out


def write(doc: dict[str, Any], out_dir: Path) -> None:
    base = next((r for r in doc["runs"] if r["variant"] == "padded" and "tokens_per_s" in r), None)
    if base:
        doc["over_padded"] = {r["variant"]: round(r["tokens_per_s"] / base["tokens_per_s"], 3)
                              for r in doc["runs"] if "tokens_per_s" in r}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "packed_attention_probe.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--pairs", type=int, default=16, help="pairs per optimizer step (the rm run's mb 16 x 1)")
    ap.add_argument("--micro-batch", type=int, default=16, help="pairs per padded forward")
    ap.add_argument("--packed-rows", type=int, default=12, help="packed rows per forward (the rm run's 12)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default="padded,packed-sdpa,packed-flex")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoModel, Qwen2Config

    from medgpt_ray.memory.shapes import load_shape

    s = load_shape(a.model)
    lengths = pair_lengths(a.pairs, a.seq_len, a.seed)
    doc: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(0),
                           "torch": torch.__version__, "model": a.model, "pairs": a.pairs, "seq_len": a.seq_len,
                           "tokens": sum(lengths), "runs": []}
    for variant in a.variants.split(","):
        impl = "flex_attention" if variant == "packed-flex" else "sdpa"
        config = Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                             num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                             intermediate_size=s.intermediate, max_position_embeddings=32768, pad_token_id=0)
        config._attn_implementation = impl
        with torch.device("cuda"):
            model = AutoModel.from_config(config, dtype=torch.bfloat16, attn_implementation=impl)
        model.gradient_checkpointing_enable()  # the stage checkpoints 86 % of layers; all here, same for each variant
        model.train()
        mb = a.micro_batch if variant == "padded" else a.packed_rows
        bl = batches(lengths, variant, mb, a.seq_len, "cuda")
        try:
            warm = [step(model, bl) for _ in range(2)]  # flex compiles its kernels on the first call
            times = [step(model, bl) for _ in range(a.repeats)]
            med = statistics.median(times)
            run = {"variant": variant, "attn": impl, "forwards": len(bl),
                   "padding_share": round(1 - sum(b["tokens"] for b in bl) / sum(b["slots"] for b in bl), 3),
                   "warmup_s": [round(t, 3) for t in warm], "step_s_median": round(med, 4),
                   "tokens_per_s": round(sum(lengths) / med, 1), "kernels": kernel_table(model, bl)}
        except Exception as e:  # a variant that cannot run here is a result
            run = {"variant": variant, "attn": impl, "error": f"{type(e).__name__}: {e}"[:1500]}
        doc["runs"].append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "kernels"}), flush=True)
        write(doc, Path(a.out))  # after every variant: a timeout keeps what finished
        del model
        torch.cuda.empty_cache()
    print(json.dumps(doc.get("over_padded")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
