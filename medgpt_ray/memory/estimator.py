"""Analytic peak GPU memory of one training stage: predicts torch.cuda.max_memory_allocated().

The model follows what PyTorch keeps alive, term by term, for the real shape
(GQA attention, SwiGLU MLP, RMSNorm, SDPA without an s^2 term), and takes the
larger of the two moments where training peaks:

  backward start: weights + optimizer states (+ reference model) + every saved
                  activation + the loss's transient memory + grads that already
                  exist (head grads; all grads when accumulating) + autocast's
                  bf16 weight copies (fp32 master weights) + under ZeRO-3 the
                  parameters DeepSpeed holds gathered (memory/zero3.py)
  optimizer step: weights + optimizer states + all gradients

Constants that PyTorch/HF implementation details decide (bytes per logit of HF's
loss, the allocator's fixed overhead) were measured on an H200 by
bench/memory_calibration.py; each says where it comes from. What differs per memory kind (activation scale,
sequences per example, reference model, score head, loss bytes) is the kind's profile (memory/profiles.py); the
per-token terms are memory/activations.py's, the setup and its checks memory/setup.py's.
"""

from __future__ import annotations

from medgpt_ray.memory.activations import PACKED_MASK_BYTES_PER_ELEMENT, activation_terms, loss_bytes
from medgpt_ray.memory.expert_lora import expert_lora_terms
from medgpt_ray.memory.profiles import memory_profile
from medgpt_ray.memory.setup import GIB, Estimate, SetupError, TrainSetup, check_setup
from medgpt_ray.memory.shapes import NF4_BYTES_PER_PARAM, ModelShape
from medgpt_ray.memory.zero3 import gather_elements

# What callers import from here: the setup, the answer, and the measured constants tests check against.
__all__ = ["GIB", "NF4_BYTES_PER_PARAM", "PACKED_MASK_BYTES_PER_ELEMENT", "RUNTIME_OVERHEAD_BYTES", "Estimate",
           "SetupError", "TrainSetup", "check_setup", "estimate"]

# CUDA caching allocator, cuBLAS workspace and library buffers seen in max_memory_allocated on an idle model.
RUNTIME_OVERHEAD_BYTES = 0.25 * GIB
# DeepSpeed's ZeRO gradient reduction buckets (reduce_bucket_size 5e7 elements, bf16 + fp32 copies), and
# with CPU offload two more fp32 staging buckets (measured: +0.4-0.5 GiB on 0.5B and 1.5B).
ZERO_BUCKET_BYTES = 5e7 * 6
ZERO_OFFLOAD_STAGING_BYTES = 5e7 * 4 * 2
STATIC_KEYS = ("weights", "master_weights", "optimizer_states", "reference_model", "zero_buffers")


def _params(shape: ModelShape, s: TrainSetup) -> tuple[float, float]:
    """(all parameters of the trained model, trainable ones)."""
    total = shape.params
    score_head = memory_profile(s.stage).score_head
    if score_head:  # sequence classification: a 1-wide score head instead of the LM head
        total = total - shape.head_params + shape.hidden
    if s.method == "full":
        return total, total
    trainable = shape.lora_params(s.lora_rank, s.lora_experts) + (shape.hidden if score_head else 0)
    return total, trainable


def _weight_bytes(shape: ModelShape, s: TrainSetup, total: float, trainable: float) -> float:
    if s.method == "qlora":
        return NF4_BYTES_PER_PARAM * shape.linear_params + 2 * (total - shape.linear_params) + 4 * trainable
    if s.method == "lora":
        base = 4 if s.precision == "fp32" else 2
        return base * total + 4 * trainable  # PEFT keeps adapters in fp32
    return 4 * total if s.precision in ("amp-bf16", "fp32") else 2 * total


def _static_terms(shape: ModelShape, s: TrainSetup, total: float, trainable: float,
                  n: int) -> tuple[dict[str, float], float, float, float]:
    """Weights, master copy, optimizer states, ZeRO's buffers and a reference model; with every gradient's bytes,
    the bytes per gradient element (outside DeepSpeed) and the optimizer state bytes per trainable parameter."""
    full = s.method == "full"
    deepspeed = s.zero > 0
    b: dict[str, float] = {}
    on_gpu = s.offload == "none"
    if deepspeed and full:
        # DeepSpeed bf16: bf16 module weights, fp32 master + Adam states partitioned over the data-parallel ranks.
        b["weights"] = 2 * total / (n if s.zero == 3 else 1)
        if s.offload == "all":  # the partitions on the CPU; the small persistent ones stay whole on the GPU
            b["weights"] = 2 * shape.small_params
        b["master_weights"] = 4 * trainable / (n if s.zero >= 1 else 1) if on_gpu else 0
    else:
        # ZeRO-3 shards the frozen base of LoRA too; ZeRO-1/2 leave the weights whole on every GPU. Parameter
        # offload keeps the partitions on the CPU: the small persistent ones and (at most) the adapters stay.
        b["weights"] = _weight_bytes(shape, s, total, trainable) / (n if s.zero == 3 else 1)
        if s.offload == "all":
            b["weights"] = 2 * shape.small_params + 4 * trainable
    state_bytes = 8.0 if s.optim == "adamw" else 2.0
    if s.optim == "adamw-8bit" and full:
        # HF keeps 32-bit states for embeddings under 8-bit Adam (stability): count those at 8 bytes.
        optimizer = 2.0 * (trainable - shape.embedding_params) + 8.0 * shape.embedding_params
    else:
        # Adam's two moments have the parameter's dtype: fp32 except pure-bf16 full training.
        if full and s.precision == "bf16" and not deepspeed:
            state_bytes = 4.0 if s.optim == "adamw" else 2.0
        optimizer = state_bytes * trainable
    b["optimizer_states"] = optimizer / (n if s.zero >= 1 else 1) if on_gpu else 0

    grad_bytes = 2 if (full and s.precision == "bf16" and not deepspeed) else 4
    if deepspeed and full:
        grads = 4 * trainable / (n if s.zero >= 2 else 1) if on_gpu else 0
        # Reduction buckets, CPU-offload staging buckets, and under ZeRO-3 the bf16 gradient partitions (one flat
        # buffer the size of the parameter partition, measured on 0.5B; DeepSpeed puts it on the CPU when the
        # optimizer is offloaded): resident from the first backward on.
        b["zero_buffers"] = ZERO_BUCKET_BYTES + (0 if on_gpu else ZERO_OFFLOAD_STAGING_BYTES) + \
            (2 * trainable / n if s.zero == 3 and on_gpu else 0)
    else:
        grads = grad_bytes * trainable

    if memory_profile(s.stage).reference and full and s.dpo_reference != "precomputed":
        b["reference_model"] = (2 if deepspeed or s.precision == "bf16" else 4) * total / (n if s.zero == 3 else 1)
    return b, grads, grad_bytes, state_bytes


def estimate(shape: ModelShape, s: TrainSetup) -> Estimate:
    check_setup(s)
    n = s.gpus if s.zero > 0 else 1
    total, trainable = _params(shape, s)
    full = s.method == "full"
    deepspeed = s.zero > 0

    # --- static: weights, master copy, optimizer states --------------------------------------------------------
    b, grads, grad_bytes, state_bytes = _static_terms(shape, s, total, trainable, n)
    own = s.kind_terms(shape, s) if s.kind_terms else None  # a kind's own networks (memory/kind_memory.py)
    b.update(own.resident if own else {})
    static = sum(b.values())
    host = _offload_host_bytes(s, total, trainable, state_bytes, n)
    gathered = gathered_bytes(shape, s, n)  # whole parameters from the first forward to the end of backward
    b.update({"gathered_parameters": gathered} if gathered else {})

    b.update(activation_terms(shape, s))
    b.update(expert_lora_terms(shape, s))  # lora.experts: PEFT's folded expert weights
    trainable_head = full
    b["loss"] = loss_bytes(shape, s, trainable_head)
    b.update(own.training if own else {})
    if full and s.precision == "amp-bf16" and not deepspeed:
        # Autocast's bf16 copies of the linear weights and the LM head, saved for backward.
        # A MoE's fused experts and routers are cast too (their matmuls run under autocast): counted, unmeasured.
        b["autocast_weight_copies"] = 2 * (shape.linear_params + shape.expert_params + shape.router_params
                                           + shape.vocab * shape.hidden)
    if s.grad_accum > 1 or (full and not deepspeed):
        # Accumulating grads live through the next micro-batch; without accumulation only the first ones
        # (the LM head/embedding, produced first in backward) coexist with the activations.
        early = grads if s.grad_accum > 1 else grad_bytes * (shape.vocab * shape.hidden)
        b["gradients"] = early
    b["runtime_overhead"] = RUNTIME_OVERHEAD_BYTES
    backward_start = sum(b.values())

    step = static + grads + RUNTIME_OVERHEAD_BYTES
    if step > backward_start:
        return Estimate(step, {**{k: v for k, v in b.items() if k in (*STATIC_KEYS, *(own.resident if own else ()))},
                               "gradients": grads, "runtime_overhead": RUNTIME_OVERHEAD_BYTES}, "optimizer step", host)
    return Estimate(backward_start, b, "backward start", host)


def gathered_bytes(shape: ModelShape, s: TrainSetup, n: int) -> float:
    """ZeRO-3's whole parameters on the GPU while the model runs (memory/zero3.py replays DeepSpeed's gathering:
    up to stage3_max_live_parameters prefetched, the largest module whole, the LM head and last layers kept at the
    turn to backward; over several ranks a gathered group's flat buffer too, while it is copied out). One rank
    gathers nothing (a view of its partition) unless the partition is on the CPU (then copied one by one)."""
    if s.zero != 3 or (n == 1 and s.offload != "all"):
        return 0.0
    score_head = memory_profile(s.stage).score_head
    lora_rank = 0 if s.method == "full" else s.lora_rank  # PEFT's wrappers: more fetches, re-gathers after recompute
    g = gather_elements(shape, s.ckpt_fraction, not score_head, lora_rank)
    return (4 if s.precision == "fp32" else 2) * (g.peak_with_buffers if n > 1 else g.peak_elements)


def _offload_host_bytes(s: TrainSetup, total: float, trainable: float, state_bytes: float, n: int) -> float:
    """DeepSpeed's CPU offload keeps, per rank, its partition of the fp32 master weights, the Adam moments and
    the fp32 gradients the CPU optimizer reads (all pinned); parameter offload adds the bf16 weights."""
    if s.offload == "none":
        return 0.0
    host = (4 + state_bytes + 4) * trainable / n
    if s.offload == "all":
        host += 2 * total / n
    return host
