"""Predicted training throughput (tokens/s per GPU): FLOPs, recompute, and what is not FLOPs.

time per micro-batch = FLOPs / (peak * efficiency(tokens)) + memory-bound loss + offload traffic,
plus the optimizer step once per accumulation cycle. The planner ranks its
candidates by it; Tune reports predicted run times from it. The GPU table holds
dense bf16 tensor-core peaks (fp32 accumulate) and memory bandwidths from the
vendors' data sheets.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache

from medgpt_ray.memory.decode_terms import decode_path, expanded_kv_bytes, kv_cache_bytes
from medgpt_ray.memory.estimator import TrainSetup
from medgpt_ray.memory.profiles import memory_profile
from medgpt_ray.memory.setup import merges_adapters
from medgpt_ray.memory.shapes import ModelShape
from medgpt_ray.memory.zero3 import gather_elements


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_tflops: float
    mem_bw_gbs: float
    mem_gib: float
    pcie_gbs: float  # host <-> device, per direction, as measured on typical boards
    # A GPU reaches its peak only with enough tokens to fill its SMs (efficiency below); a CPU core's matmuls are
    # near theirs at any size. None: the GPUs' fitted T_HALF_NUMERATOR.
    t_half_numerator: float | None = None
    launch_seconds: float | None = None  # one eager op's host cost (None: the GPUs' LAUNCH_SECONDS)


GPU_SPECS: dict[str, GPUSpec] = {
    "rtx4090": GPUSpec("NVIDIA GeForce RTX 4090", 165.2, 1008, 24, 22),
    "rtx3090": GPUSpec("NVIDIA GeForce RTX 3090", 71.0, 936, 24, 22),
    "a100-40gb": GPUSpec("NVIDIA A100 40GB", 312.0, 1555, 40, 22),
    "a100-80gb": GPUSpec("NVIDIA A100 80GB", 312.0, 2039, 80, 22),
    "h100": GPUSpec("NVIDIA H100 80GB HBM3", 989.0, 3350, 80, 50),
    "h200": GPUSpec("NVIDIA H200", 989.0, 4800, 141, 50),
    # A worker's share of a CPU: fitted on `make demo`'s four stages (2 cores, 2 workers, the tiny model; 2026-12-06:
    # pt 25,429, sft 10,731, rm 59,458, dpo 9,932 tokens/s): predicted at 0.55, 1.5, 0.53 and 1.02 of that, where a
    # GPU's saturation curve and launch cost put them at 0.03-0.35 (`plan` said 395 tokens/s for pt).
    "cpu": GPUSpec("CPU", 0.03, 20, 0, 50, t_half_numerator=0.0, launch_seconds=2e-5),
}

# Share of the peak that large HF/TRL training steps reach (calibrated against the H200 runs of
# bench/throughput_outcome.py); small micro-batches reach less: efficiency(T) = MAX * T / (T + T_HALF).
MAX_EFFICIENCY = 0.45
T_HALF_NUMERATOR = 2.5e9  # T_HALF = this / hidden^2 tokens: wide layers saturate the GPU with fewer tokens
QLORA_DEQUANT_FACTOR = 1.25  # NF4 weights are dequantized before every matmul, forward and backward
HF_LOSS_BYTES_MOVED_PER_LOGIT = 24  # upcast, log_softmax, gradient: memory-bound passes over b*s*V
CPU_ADAM_PARAMS_PER_S = 1.0e9  # DeepSpeed CPU Adam on a desktop CPU
# Every micro-batch pays for its eager-mode ops whatever its size: ~30 per decoder layer and ~8 more per
# LoRA-adapted projection, per pass (forward, backward, recompute). Measured on the H200 (7B LoRA through TRL,
# bench/results/throughput_outcome_h200.json): ~0.3 s per micro-batch, i.e. ~40 us per op with Python and
# launch overhead. It is why a larger micro-batch beats less recompute on fast GPUs.
LAUNCH_SECONDS = 4e-5
KERNELS_PER_LAYER = 30
KERNELS_PER_LAYER_FUSED = 18  # Liger: one kernel per RMSNorm, SwiGLU and RoPE instead of several each
KERNELS_PER_LORA_PROJECTION = 8
# Gated DeltaNet on transformers' PyTorch delta rule (no flash-linear-attention): launch-bound, a fixed ~200 ops per
# layer and pass (the UT transform) and ~21 more per chunk of 64 tokens of the sequential scan, batched over the
# micro-batch's rows. Fitted on the H200 (transformers 5.17, 0.75B Qwen3.5 text, LoRA, 1 row a micro-batch, every
# layer checkpointed; bench/results/real_length_throughput_qwen3.5-0.8b_lora_h200.json): 0.43 s a micro-batch plus
# 0.71 ms a token, 297 tokens/s on that data, where the dense terms alone predicted 34,200.
DELTA_RULE_OPS = 200
DELTA_RULE_OPS_PER_CHUNK = 21
DELTA_RULE_CHUNK_TOKENS = 64
# What TRL's own loss code costs beyond the terms above is each memory kind's `loss_path_efficiency`
# (memory/profiles.py, with the measurements).


def spec_for(name: str) -> GPUSpec:
    key = name.lower().replace("nvidia", "").replace("geforce", "").replace(" ", "").replace("-", "")
    for k, spec in GPU_SPECS.items():
        if k.replace("-", "") in key or key in k.replace("-", ""):
            return spec
    raise KeyError(f"unknown GPU {name!r}; known: {', '.join(GPU_SPECS)}")


def matmul_params(shape: ModelShape) -> int:
    """The weights one token multiplies by: the projections, the router and the experts it is routed to (a MoE's
    idle experts hold memory, not FLOPs); the embedding is a lookup and the LM head is counted on its own."""
    return shape.active_params - shape.embedding_params - shape.head_params - shape.small_params


def flops_per_token(shape: ModelShape, s: TrainSetup) -> float:
    """Training FLOPs per token: forward, backward (input grads; weight grads when trained), recompute."""
    linear = 2 * matmul_params(shape)
    # Causal: half of QK^T and AV, on the full-attention layers (linear attention's state is O(1) per token).
    attention = 2 * (shape.layers - len(shape.linear_layers)) * s.seq_len * shape.q_dim
    profile = memory_profile(s.stage)
    head = 0 if profile.score_head else 2 * shape.vocab * shape.hidden
    forward = linear + attention + head
    layers_fwd = linear + attention
    if s.method == "full":
        backward = 2 * forward
    else:
        # A frozen LM head (pt) takes its input grad only, already in `forward`.
        backward = forward + 2 * 2 * shape.lora_params(s.lora_rank)
    recompute = s.ckpt_fraction * layers_fwd
    total = forward + backward + recompute
    if s.method == "qlora":
        total += (QLORA_DEQUANT_FACTOR - 1) * (2 * forward + recompute - head)
    if profile.reference and s.dpo_reference != "precomputed":
        total += forward  # the reference model's (or adapter-off policy's) forward
    if s.kl_batch:
        total += 2 * forward  # KTO's KL batch: the policy's and the reference's no-grad forwards
    return total


def step_seconds(shape: ModelShape, s: TrainSetup, gpu: GPUSpec) -> float:
    """Seconds for one optimizer step's share of one micro-batch on one GPU."""
    tokens = s.tokens()
    t_half = (T_HALF_NUMERATOR if gpu.t_half_numerator is None else gpu.t_half_numerator) / shape.hidden**2
    eff = MAX_EFFICIENCY * tokens / (tokens + t_half)
    seconds = tokens * flops_per_token(shape, s) / (gpu.bf16_tflops * 1e12 * eff)
    per_layer = KERNELS_PER_LAYER_FUSED if s.fused_kernels else KERNELS_PER_LAYER
    kernels = shape.layers * (per_layer + (7 * KERNELS_PER_LORA_PROJECTION if s.method != "full" else 0))
    kernels += delta_rule_ops(shape, s.seq_len, s.linear_kernels)
    seconds += kernels * (2 + s.ckpt_fraction) * (LAUNCH_SECONDS if gpu.launch_seconds is None else gpu.launch_seconds)
    profile = memory_profile(s.stage)
    if not (profile.score_head or profile.chunked_head) and not s.fused_ce:  # a loss over the full logits
        seconds += HF_LOSS_BYTES_MOVED_PER_LOGIT * tokens * shape.vocab / (gpu.mem_bw_gbs * 1e9)
    seconds /= profile.loss_path_efficiency
    trainable = shape.params if s.method == "full" else shape.lora_params(s.lora_rank, s.lora_experts)
    n = max(s.gpus, 1)
    per_step = 0.0
    if s.offload in ("optimizer", "all"):
        # Gradients down, updated bf16 weights up, Adam on the CPU: once per optimizer step.
        per_step += (4 + 2) * trainable / n / (gpu.pcie_gbs * 1e9) + trainable / n / CPU_ADAM_PARAMS_PER_S
    else:
        per_step += 16 * 2 * trainable / n / (gpu.mem_bw_gbs * 1e9)  # fused AdamW: read/write weights+states
    if s.offload == "all":
        # ZeRO-3 parameter offload: the bf16 weights cross PCIe for forward, backward (and recompute).
        seconds += 2 * shape.params * (2 + s.ckpt_fraction) / (gpu.pcie_gbs * 1e9)
    if n > 1:
        # Data-parallel gradient reduction over PCIe without peer-to-peer (consumer cards): a ring all-reduce
        # moves 2(n-1)/n of the bf16 gradients per optimizer step; ZeRO-3 also gathers weights every pass.
        per_step += 2 * (n - 1) / n * 2 * trainable / (gpu.pcie_gbs * 1e9 / 2)
        if s.zero == 3:
            seconds += zero3_gather_seconds(shape, s, gpu, n)
    if s.generations:
        # Sampling: completion_len decode steps per generate call, one call per gen_steps micro-batches.
        seconds += s.completion_len * decode_step_seconds(shape, s, gpu) / (s.gen_steps or s.grad_accum)
    return seconds + per_step / s.grad_accum


@cache
def fla_installed() -> bool:
    return importlib.util.find_spec("fla") is not None


def delta_rule_ops(shape: ModelShape, seq_len: int, on_kernels: bool | None = None) -> int:
    """The ops of one pass of a hybrid's linear-attention layers on transformers' PyTorch delta rule (none on
    flash-linear-attention's kernels, or for a model without linear attention). `on_kernels`: what the GPU's probe
    said training runs on (TrainSetup.linear_kernels); None: not probed, the kernels where fla imports here."""
    if not shape.linear_layers or (fla_installed() if on_kernels is None else on_kernels):
        return 0
    chunks = -(-seq_len // DELTA_RULE_CHUNK_TOKENS)
    return len(shape.linear_layers) * (DELTA_RULE_OPS + DELTA_RULE_OPS_PER_CHUNK * chunks)


def zero3_gather_seconds(shape: ModelShape, s: TrainSetup, gpu: GPUSpec, n: int) -> float:
    """ZeRO-3's all-gathers of one micro-batch: every parameter, a MoE's idle experts too, in forward and again in
    backward, and a LoRA base's frozen weights once more for the recompute (less what DeepSpeed keeps gathered:
    memory/zero3.py replays it); each rank receives (n-1)/n of every gathered weight, through the host at half the
    link's bandwidth."""
    lm_head, lora_rank = not memory_profile(s.stage).score_head, 0 if s.method == "full" else s.lora_rank
    elements = gather_elements(shape, s.ckpt_fraction, lm_head, lora_rank).per_micro_batch
    return (4 if s.precision == "fp32" else 2) * elements * (n - 1) / n / (gpu.pcie_gbs * 1e9 / 2)


# The static path's decode step (the step compiled into CUDA graphs): a fixed host cost a step (the loop and sampling
# run outside the graph) and the bytes the step moves at a share of the memory bandwidth. Fitted on the H200's four
# points in transformers' generate loop (bench/results/generation_{1.5b,7b}_h200.json: 1.5B and 7B, 16 and 64
# sequences, 384-token cache; least squares, each point within 6 %: 5.66 ms predicted for 5.54, 7.80 for 8.27, 10.38
# for 9.90, 15.31 for 15.44), which waits for the GPU every token: GENERATE_LOOP_HOST_SECONDS. The product's own loop
# (generation/decode_loop.py) queues the next step while the GPU runs the last; its host term, at the same share, is
# the mean of the H100's two points (generation_1.5b_h100_loop.json: 3.27 and 4.06 ms measured at 16 and 64
# sequences, 3.55 and 3.79 predicted). A host's speed varies between machines: the term is a fit, not a bound.
GENERATE_LOOP_HOST_SECONDS = 4.0e-3
STATIC_STEP_HOST_SECONDS = 2.1e-3
STATIC_BANDWIDTH_SHARE = 0.67  # of the spec sheet's bandwidth (GPU_SPECS)


def decode_step_seconds(shape: ModelShape, s: TrainSetup, gpu: GPUSpec) -> float:
    """One token of one generate call (HF generate, KV cache). Eager (the dynamic path, or static without
    compilation): a forward's eager ops one by one, or reading the weights once, whichever is longer; the batch
    barely matters. The H200 measured 45-70 ms for Qwen2.5-1.5B and 7B alike (28 layers each, LoRA unmerged:
    bench/results/generate_speed_probe_1.5b_h200.json, rl_stage_run_*); issue 35's probe on the 1.5B at 16
    sequences: 127 ms a step with the adapters unmerged, 37 merged (no adapter kernels: merged rollouts,
    memory/generation.py merges_adapters). Compiled static path: static_decode_step_seconds."""
    path = decode_path(shape, s)
    if path is not None and path.compiled:
        return static_decode_step_seconds(shape, s, gpu)
    per_layer = KERNELS_PER_LAYER_FUSED if s.fused_kernels else KERNELS_PER_LAYER
    adapters = s.method != "full" and not merges_adapters(s)
    kernels = shape.layers * (per_layer + (7 * KERNELS_PER_LORA_PROJECTION if adapters else 0))
    return max(kernels * LAUNCH_SECONDS, 2 * shape.params / (gpu.mem_bw_gbs * 1e9))


def static_decode_step_seconds(shape: ModelShape, s: TrainSetup, gpu: GPUSpec, repeat_kv: bool = False,
                               generate_loop: bool = False) -> float:
    """A decode step replayed from CUDA graphs: the loop's host term (STATIC_STEP_HOST_SECONDS for ours,
    GENERATE_LOOP_HOST_SECONDS for transformers' generate loop, `generate_loop`), plus the bytes it moves at
    STATIC_BANDWIDTH_SHARE of the memory bandwidth: the weights once, and per sequence the static cache's K and V
    over its full length (seq_len). `repeat_kv`: transformers' SDPA attention as it is, which copies K and V to
    every query head, written and read (memory/generation.expanded_kv_bytes): how the H200's points were measured
    (fitted with it); the product decodes without the copy (generation/packed_gqa.py)."""
    e = 4 if s.precision == "fp32" else 2
    copies = 2 * shape.attention_layers * expanded_kv_bytes(shape, s) if repeat_kv else 0.0
    moved = e * shape.params + kv_cache_bytes(shape, s) + copies
    host = GENERATE_LOOP_HOST_SECONDS if generate_loop else STATIC_STEP_HOST_SECONDS
    return host + moved / (STATIC_BANDWIDTH_SHARE * gpu.mem_bw_gbs * 1e9)


def tokens_per_second(shape: ModelShape, s: TrainSetup, gpu: GPUSpec) -> float:
    """Trained tokens per second per GPU (rm and dpo count both responses of a pair)."""
    return s.tokens() / step_seconds(shape, s, gpu)
