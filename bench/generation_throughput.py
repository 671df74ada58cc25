"""Generation throughput of each engine path (issue 35 item 5): new tokens/s, ms per decode step, the decode floor
(bytes a decode step reads, weights + KV cache, over the HBM bandwidth measured here) and the ratio to it, and the
peak memory, for one random-init model at each generation batch, under a memory cap (the 24 GiB of a 4090 on the
H200). Every sequence runs to --new-tokens (min_new_tokens: random weights rarely stop, this makes sure).

Paths (--paths, all by default):
  unmerged        PEFT LoRA (r8, all linear layers, as the grpo stage) unmerged, HF generate, dynamic cache: what the
                  rollouts did before issue 35
  merged          the same adapter merged for the call (trainer_kit/merged_rollouts.py: what the rollouts do now)
  merged-static   merged, the product's static decode path (generation/decode_path.py StaticDecoder: what grpo, rloo,
                  opd and `generate` run on a GPU): one static cache for the run, transformers compiles the decode
                  step itself (CUDA graphs). The untimed warm-up call compiles and captures; the timed call of another
                  prompt length must replay: `graphs_compiled_in_timed_call` (dynamo graphs compiled during it) and
                  `cudagraph_skips` (inductor's count of graphs it ran without CUDA graphs) must both be 0; its decode
                  attends without repeat_kv's copies (generation/packed_gqa.py: `attention` packed_gqa), in the
                  product's own decode loop (generation/decode_loop.py, `loop` medgpt: no host wait on the GPU a token)
  merged-static-sdpa  the same with transformers' SDPA attention as it is (repeat_kv every step): the comparison
  merged-static-generate  merged-static decoded by transformers' generate loop (its stop check and multinomial
                  wait for the GPU every token): the comparison for the loop, and how the H200's first points ran
  continuous      merged, transformers' continuous batching (generate_batch) with its page pool sized for the batch
                  (generation/continuous.py's sizing: the engine `serve` uses)
  continuous-graphs  the same with the engine's CUDA graphs forced on (use_cuda_graph=True; with SDPA attention it
                  leaves them off by default): whether `serve` should

    python bench/generation_throughput.py --shape qwen2.5-1.5b --batches 16,64 --out $OUT/generation_1.5b.json
    python bench/generation_throughput.py --shape qwen2.5-7b --batches 16,64 --out $OUT/generation_7b.json
    python bench/generation_throughput.py --model-dir ~/.cache/medgpt-ray/tiny-... --device cpu --batches 2 \\
        --new-tokens 8 --prompt-len 32     # a smoke run of the code paths on CPU (no compilation there)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.decode_profile import profiled  # noqa: E402

PATHS = ("unmerged", "merged", "merged-static", "merged-static-sdpa", "merged-static-generate", "continuous",
         "continuous-graphs")


def hbm_bandwidth(device: str) -> float | None:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), the best of five; None on a CPU."""
    import torch

    if device != "cuda":
        return None
    a = torch.empty(2**30, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del a, b
    return 2 * 2**31 / best


def random_model(shape: str, dest: Path) -> Path:
    from bench.family_models import prepare_model
    from medgpt_ray.tiny import ensure_tiny

    return prepare_model(shape, dest, ensure_tiny())


def with_lora(model: Any) -> Any:
    """The grpo stage's adapter (models.lora_config: rank 8, all linear layers) with a non-zero B, as a trained
    adapter has (PEFT starts B at zero, which would make merged and unmerged the same model)."""
    import torch
    from peft import get_peft_model

    from medgpt_ray import models
    from medgpt_ray.config import LoraConfig

    peft_model = get_peft_model(model, models.lora_config(LoraConfig(rank=8, alpha=16, dropout=0.0), "CAUSAL_LM",
                                                          model))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01)
    return peft_model.eval()


def decode_bytes(model: Any, batch: int, prompt_len: int, new_tokens: int) -> float:
    """What a decode step reads on average: every weight once, and the KV cache at its mean length."""
    from medgpt_ray.generation.decode_path import static_cache_bytes

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + static_cache_bytes(model.config, batch, prompt_len + new_tokens / 2)


def predicted_gib(shape: Any, model: Any, batch: int, prompt_len: int, new_tokens: int, path: str,
                  device: str) -> float:
    """The plan's generation-phase terms for this call (memory/generation.generate_call_terms, the decode path as
    the product chooses it) and the weights as loaded (adapters too). No runtime overhead: the measured peak is the
    allocator's (max_memory_allocated), without the CUDA context."""
    from medgpt_ray.memory.generation import generate_call_terms
    from medgpt_ray.memory.setup import TrainSetup

    s = TrainSetup(stage="grpo", method="lora", precision="bf16" if device == "cuda" else "fp32", micro_batch=batch,
                   seq_len=prompt_len + new_tokens, generations=1, completion_len=new_tokens,
                   generation_path="static" if path.startswith("merged-static") else "dynamic",
                   generation_on_gpu=device == "cuda")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return (weights + sum(generate_call_terms(shape, s).values())) / 2**30


def timed(fn: Any, device: str, warm: Any = None) -> tuple[float, float]:
    """(seconds, peak GiB) of fn(), after one untimed call of `warm` (fn when None; warm-up: allocation,
    compilation, CUDA graphs)."""
    import torch

    t0 = time.perf_counter()
    (warm or fn)()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    LAST_CALL["warmup_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    # Reserved too: a CUDA-graph pool's free blocks stay the graphs' (no other allocation may use them) but are not
    # allocated memory, so only the reserved peak shows what the static path really holds.
    LAST_CALL["reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else 0.0
    seconds = time.perf_counter() - t0
    if PROFILE.get("steps"):  # the same call once more, under the profiler (after the timing: it slows the host)
        PROFILE["last"] = profiled(fn, device, PROFILE["steps"])
    return seconds, peak


PROFILE: dict[str, Any] = {}  # --profile: "steps" a call decodes; "last": the last timed call's profile
# the last timed call's peak of the allocator's reserved memory ("reserved_gib") and its warm-up call's seconds
LAST_CALL: dict[str, float] = {}


def run_path(path: str, model: Any, ids: Any, new_tokens: int, device: str) -> tuple[float, float]:
    """Seconds and peak GiB of one timed generate call of `path` over the prompts `ids` ([batch, prompt_len])."""
    import torch

    from medgpt_ray.trainer_kit.merged_rollouts import host_copy, lora_layers, merged_adapters

    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_p=1.0,
              pad_token_id=0, attention_mask=torch.ones_like(ids))
    layers = lora_layers(model)
    base = host_copy(layers)

    def hf(extra: dict) -> Any:
        def call() -> Any:
            with torch.no_grad():
                return model.generate(ids, **kw, **extra)
        return call

    if path == "unmerged":
        return timed(hf({}), device)
    with merged_adapters(layers, base):
        if path == "merged":
            return timed(hf({}), device)
        if path.startswith("merged-static"):
            return static_call(model, ids, kw, new_tokens, device, packed_gqa=path != "merged-static-sdpa",
                               own_loop=path != "merged-static-generate")
        try:
            return timed(continuous_call(model, ids, new_tokens, graphs=path == "continuous-graphs"), device)
        finally:  # the warm-up call made it, the timed one reused it (its start-up is not decode time)
            model.destroy_cached_continuous_batching_manager()


def static_call(model: Any, ids: Any, kw: dict, new_tokens: int, device: str, packed_gqa: bool = True,
                own_loop: bool = True) -> tuple[float, float]:
    """The product's static path (StaticDecoder, one cache for both calls): warmed up on prompts 16 tokens shorter
    (left-padded), so the timed call shows whether another prompt length replays the compiled step."""
    import torch
    from torch._dynamo.utils import counters

    from medgpt_ray.generation.decode_path import StaticDecoder

    decoder = StaticDecoder(ids.shape[1] + new_tokens, packed_gqa=packed_gqa, own_loop=own_loop)
    rest = {k: v for k, v in kw.items() if k != "attention_mask"}
    short = ids.clone()
    short_mask = torch.ones_like(ids)
    short_mask[:, :16] = 0

    def call(prompts: Any, mask: Any) -> Any:
        with torch.no_grad():
            return decoder.generate(model, prompts, attention_mask=mask, **rest)

    warm = lambda: call(short, short_mask)  # noqa: E731
    graphs = []
    def timed_call() -> Any:
        graphs.append(counters["stats"]["unique_graphs"])
        return call(ids, torch.ones_like(ids))
    seconds, peak = timed(timed_call, device, warm)
    STATIC_CHECKS.update(graphs_compiled_in_timed_call=counters["stats"]["unique_graphs"] - graphs[-1],
                         cudagraph_skips=counters["inductor"]["cudagraph_skips"], cache_builds=decoder.builds,
                         attention=decoder.attention, loop=decoder.loop)
    return seconds, peak


STATIC_CHECKS: dict[str, int] = {}  # the last static_call's compile checks, added to its row


def continuous_call(model: Any, ids: Any, new_tokens: int, graphs: bool = False) -> Any:
    """transformers' generate_batch with its page pool sized for this batch (not its default share of the GPU)."""
    from transformers import GenerationConfig

    from medgpt_ray.generation.continuous import PoolLimits, pool_config, pool_pages

    batch, prompt_len = ids.shape
    limits = PoolLimits(batch, prompt_len + new_tokens)
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=True, temperature=0.999, top_p=1.0,
                              eos_token_id=-1, pad_token_id=0)
    pool = pool_config(pool_pages(model, limits), max_requests_per_batch=batch, allow_block_sharing=False,
                       **({"use_cuda_graph": True} if graphs else {}))
    inputs = ids.tolist()
    return lambda: model.generate_batch(inputs, generation_config=config, continuous_batching_config=pool,
                                        persistent_manager=True)


def measure(a: argparse.Namespace, on_row: Any) -> dict[str, Any]:
    """Every path at every batch; `on_row(result so far)` after each row (a run cut by its timeout keeps them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from medgpt_ray.memory.shapes import load_shape

    device = a.device
    if device == "cuda" and a.cap_gib:
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    model_dir = Path(a.model_dir) if a.model_dir else random_model(a.shape, Path(a.work))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = with_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device))
    bandwidth = hbm_bandwidth(device)
    shape = load_shape(a.shape or str(model_dir))
    def result(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "hbm_bytes_per_s": bandwidth,
                "model": a.shape or str(model_dir), "cap_gib": a.cap_gib, "prompt_len": a.prompt_len,
                "new_tokens": a.new_tokens, "rows": rows}

    rows = []
    for batch in a.batches:
        ids = torch.randint(100, min(20_000, model.config.vocab_size), (batch, a.prompt_len), device=device)
        for path in a.paths:
            row: dict[str, Any] = {"path": path, "batch": batch}
            PROFILE["steps"] = a.new_tokens if path in (a.profile or ()) else 0
            try:
                seconds, peak = run_path(path, model, ids, a.new_tokens, device)
            except Exception as e:  # a path that cannot run here (no kernel, OOM under the cap) is a result too
                rows.append({**row, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                torch.cuda.empty_cache() if device == "cuda" else None
                continue
            step_ms = 1000 * seconds / a.new_tokens
            floor_ms = 1000 * decode_bytes(model, batch, a.prompt_len, a.new_tokens) / bandwidth if bandwidth else None
            if path.startswith("merged-static"):
                row.update(STATIC_CHECKS)
            if path.startswith("merged"):  # the product's rollout paths: the plan's terms for them
                row["predicted_peak_gib"] = round(predicted_gib(shape, model, batch, a.prompt_len, a.new_tokens,
                                                                path, device), 3)
            rows.append({**row, "new_tokens_per_s": round(batch * a.new_tokens / seconds, 1),
                         "ms_per_decode_step": round(step_ms, 2), "peak_gib": round(peak, 3),
                         "peak_reserved_gib": round(LAST_CALL.get("reserved_gib", 0.0), 3),
                         "warmup_s": round(LAST_CALL.get("warmup_s", 0.0), 2),
                         "decode_floor_ms": round(floor_ms, 3) if floor_ms else None,
                         "ratio_to_floor": round(step_ms / floor_ms, 1) if floor_ms else None,
                         **({"profile": PROFILE.pop("last")} if "last" in PROFILE else {})})
            print(json.dumps(rows[-1]), flush=True)
            on_row(result(rows))
    return result(rows)


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model and device options the generation benches share."""
    ap.add_argument("--shape", default=None, help="a preset shape built with random weights (e.g. qwen2.5-1.5b)")
    ap.add_argument("--model-dir", default=None, help="a model directory instead of --shape")
    ap.add_argument("--work", default="/tmp/medgpt-gen-bench", help="where --shape's model is built")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cap-gib", type=float, default=24.0, help="per-process GPU memory cap (0: none)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--paths", type=lambda s: s.split(","), default=list(PATHS))
    ap.add_argument("--profile", nargs="?", const="merged-static", type=lambda s: s.split(","), default=None,
                    help="these paths' timed calls once more under torch.profiler (default merged-static): GPU-busy "
                    "vs wall time a decode step, launches, top ops (bench/decode_profile.py). Not the unmerged "
                    "path on a GPU: its ~3,000 ops a step took the H200 call past 280 s before its first row")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if not (a.shape or a.model_dir) or any(p not in PATHS for p in a.paths):
        ap.error(f"--shape or --model-dir; --paths among {', '.join(PATHS)}")
    write_result(a.out, argv, measure(a, lambda partial: write_result(a.out, argv, partial)))
    return 0


def write_result(out: Path | None, argv: list[str] | None, result: dict[str, Any]) -> None:
    """`result` with the command that made it, written to `out` (the generation benches' JSON)."""
    if out:
        command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": command, **result}, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
