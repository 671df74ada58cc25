"""Which engine a `serve` replica batches requests on (`--engine`), sized from the server's limits, and the line that
says so: our slot engine, transformers' continuous batching, or one generate call per request, with the reason."""

from __future__ import annotations

from typing import Any

from medgpt_ray.generation.continuous import ContinuousEngine, PoolLimits, RequestEngine, unsupported_reason
from medgpt_ray.generation.engine import Generator
from medgpt_ray.infer.limits import ServeLimits

# --engine: slots (ours on the static cache and its compiled decode step, generation/slot_engine.py), transformers
# (its continuous batching, eager steps on a page pool), or auto: slots where the model's layers fit them (not
# linear-attention or sliding-window layers), else transformers'. Measured with 32 streaming clients x 256 tokens on a
# 1.5B (bench/results/serve_load_1.5b_h100_{slots,transformers}_4.json): 4,198 tokens/s on slots, 636 on transformers'.
ENGINES = ("auto", "transformers", "slots")


def engine_for(engine: str, config: Any) -> str:
    """The engine `--engine` names for a model of this config: auto resolved to slots or transformers."""
    from medgpt_ray.generation.slot_cache import slot_unsupported_reason

    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine == "auto":
        return "slots" if slot_unsupported_reason(config) is None else "transformers"
    return engine


def engine_line(model_path: str, engine: str) -> str:
    """What `serve` says at start: the engine its replicas batch requests on, and why where it is not ours."""
    from transformers import AutoConfig

    from medgpt_ray.generation.slot_cache import slot_unsupported_reason

    config = AutoConfig.from_pretrained(model_path)
    if engine_for(engine, config) == "slots":
        if (reason := slot_unsupported_reason(config)) is not None:
            return f"engine: one generate call per request (--engine slots: {reason})"
        return "engine: slots (our decode loop on a static cache, the one sampler)"
    why = f"auto: {slot_unsupported_reason(config)}" if engine == "auto" else "--engine transformers"
    reason = unsupported_reason(config)
    if reason is not None:
        return f"engine: one generate call per request ({why}; transformers' engine: {reason})"
    return f"engine: transformers' continuous batching ({why})"


def serving_path(gen: Generator, limits: ServeLimits, context: int | None,
                 engine: str = "auto") -> tuple[RequestEngine | None, str]:
    """How a replica answers: continuous batching across its requests on `engine` (transformers': its page pool
    sized for max_concurrent requests of a prompt and max_tokens each; slots: max_concurrent rows of a static cache),
    or where the model cannot run on it, one generate call per request in a thread of its own; and that choice in
    words (the responses' system_fingerprint)."""
    from medgpt_ray.generation.slot_cache import slot_unsupported_reason
    from medgpt_ray.generation.slot_engine import PROMPT_TOKENS, SlotEngine

    slots = engine_for(engine, gen.model.config) == "slots"
    reason = slot_unsupported_reason(gen.model.config) if slots else unsupported_reason(gen.model.config)
    if reason is not None:
        # each on the dynamic path (stream.py, no DecodeSession): concurrent requests cannot share a batch-1 cache
        return None, f"one generate call per request, dynamic decode: {reason}"
    per_request = (limits.max_prompt_tokens or context or 2048) + limits.max_tokens_limit
    per_request = min(per_request, context) if context else per_request
    eng: RequestEngine
    if slots:  # a slot's length is read every step: sized to the prompts served, not to the context
        per_request = (limits.max_prompt_tokens or PROMPT_TOKENS) + limits.max_tokens_limit
        eng = SlotEngine(gen, PoolLimits(limits.max_concurrent, min(per_request, context or per_request)))
        path = f"continuous batching on static-cache slots: up to {limits.max_concurrent} requests at once, " \
               f"{eng.request_room} tokens each"
    else:
        eng = ContinuousEngine(gen, PoolLimits(limits.max_concurrent, per_request))
        path = f"continuous batching: up to {limits.max_concurrent} requests at once"
    eng.stream_interval = limits.stream_interval
    return eng, path
