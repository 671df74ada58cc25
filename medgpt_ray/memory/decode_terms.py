"""The decode path a generating stage's rollouts take and the bytes of their attention caches, from the model's
shape and the stage's setup: what the memory plan (memory/generation.py) and the throughput model
(memory/throughput.py) both price."""

from __future__ import annotations

from medgpt_ray.generation.decode_path import DecodePath, choose
from medgpt_ray.memory.estimator import TrainSetup
from medgpt_ray.memory.shapes import ModelShape


def decode_path(shape: ModelShape, s: TrainSetup) -> DecodePath | None:
    """How a generating stage's rollouts decode (the `generation_path` key, the policy and its device); None for a
    stage that does not generate."""
    if not s.generations:
        return None
    return choose(s.generation_path, cuda=s.generation_on_gpu, hybrid=bool(shape.linear_layers),
                  quantized=s.method == "qlora", zero3=s.zero == 3)


def kv_cache_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """K and V of every full-attention layer for every token of the generation batch (it grows with the length)."""
    e = 4 if s.precision == "fp32" else 2
    return 2 * shape.attention_layers * shape.kv_heads * shape.head_dim * e * s.generation_batch() * s.seq_len


def expanded_kv_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """K and V of one layer repeated from the KV heads to all query heads over the cache's full length, for the
    generation batch: transformers' SDPA attention takes grouped-query attention natively only without a mask, and
    generation always passes one (padding; the static cache's length), so `repeat_kv` materializes them at every
    decode step (and in the prefill). 0 where every query head has its own KV head. On the H200 the static path's
    measured peaks (bench/results/generation_*_h200.json) exceeded the plan's terms without it (7B, 16 sequences:
    14.935 GiB measured, 14.894 predicted)."""
    if shape.heads <= shape.kv_heads:
        return 0.0
    e = 4 if s.precision == "fp32" else 2
    return 2 * s.generation_batch() * shape.heads * shape.head_dim * s.seq_len * e
