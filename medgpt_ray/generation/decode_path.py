"""How generate decodes, one rule for every generating caller (grpo/rloo rollouts, opd's student samples, the eval
stage and `generate` through the Generator): the decode path, chosen once per run and named with its reason.

  dynamic  HF generate with a dynamic cache (it grows by concatenation every token), the decode step run eagerly:
           every token pays Python and one kernel launch per op (28-37 ms a step for a 1.5B model on the H200,
           issue 35, where reading the weights takes under 1 ms)
  static   a static cache (StaticCache: K and V at their full length, written in place) that generate's own
           auto-compilation accepts: on CUDA transformers compiles the decode step itself (`get_compiled_call`, mode
           "reduce-overhead": CUDA graphs) and copies the logits out of the graph's pool every step. Not a hand-made
           torch.compile of the forward (that failed: the graphs' outputs were overwritten, issue 35).

StaticDecoder holds ONE cache for the whole run, at a length fixed up front, reset before every call: a new cache
per call (what generate does with `cache_implementation="static"`) gives the compiled step new tensors to read, and
CUDA graph trees re-record for every new address (torch's mark_static_address) and give up after a limit. The
prefill runs eagerly in transformers 5.17 and 5.24 alike, so prompts of any length up to the cache's room share the
one compiled decode step: its inputs ([batch, 1] ids and positions, the 4-D mask over the cache's full length) keep
their shapes. The batch is fixed with the cache: a caller pads a short batch (engine.py) or has a fixed one (TRL's
generation batch). transformers 5.17 names generate's cache argument `past_key_values`, 5.24 `cache` (the old name
deprecated): `cache_kwarg` asks the model which. The tokens are drawn by decode_loop.py (generate's settings and
compiled step without its waits on the GPU), or by generate itself for a call the loop does not cover."""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from medgpt_ray.generation import decode_loop
from medgpt_ray.generation.packed_gqa import packed_gqa_decoding

DYNAMIC, STATIC = "dynamic", "static"
REQUESTS = ("auto", DYNAMIC, STATIC)


@dataclass(frozen=True)
class DecodePath:
    name: str  # dynamic | static
    reason: str
    compiled: bool = False  # transformers compiles the decode step (CUDA graphs): static on CUDA

    def describe(self) -> str:
        return f"{self.name} ({self.reason})"


# A hybrid's linear-attention layers keep their state in the static cache in place (hybrid/cached.py). Measured on an
# H100 (bench/results/hybrid_h100_call2/): Qwen3.5-0.8B at 16 x 256, 4,194 new tokens/s on this path (one graph, no
# CUDA-graph skips) against generate's dynamic path's 557.
HYBRID_NOTE = "; linear-attention layers' state held in the static cache"


def blocker(hybrid: bool = False, quantized: bool = False, zero3: bool = False) -> str | None:
    """Why a compiled static decode does not suit this policy (None: it does)."""
    if zero3:
        return "ZeRO-3: the weights are partitions gathered per forward, outside any graph"
    if quantized:
        return "a 4-bit QLoRA base: bitsandbytes' layers do not compile"
    return None


def choose(requested: str = "auto", *, cuda: bool, hybrid: bool = False, quantized: bool = False,
           zero3: bool = False) -> DecodePath:
    """The decode path for `requested` (the `generation_path` key: auto, dynamic or static). auto: static on CUDA for
    a compilable policy, else dynamic (on the CPU compilation gains nothing: no kernel launches to save). A forced
    static is kept except under ZeRO-3, which cannot run it; its reason says what it gives up."""
    if requested not in REQUESTS:
        raise ValueError(f"generation_path {requested!r}: one of {', '.join(REQUESTS)}")
    why_not = blocker(hybrid, quantized, zero3)
    if requested == DYNAMIC:
        return DecodePath(DYNAMIC, "generation_path: dynamic")
    if requested == STATIC:
        if zero3:
            return DecodePath(DYNAMIC, f"generation_path: static refused: {why_not}")
        compiled = cuda and not quantized
        note = "" if compiled else "; no compilation " + ("on the CPU" if not cuda else "(bitsandbytes)")
        return DecodePath(STATIC, f"generation_path: static{note}{HYBRID_NOTE if hybrid else ''}", compiled)
    if why_not:
        return DecodePath(DYNAMIC, f"auto: {why_not}")
    if not cuda:
        return DecodePath(DYNAMIC, "auto: on the CPU a compiled decode step saves nothing")
    return DecodePath(STATIC, "auto: static cache, the decode step compiled by transformers with CUDA graphs"
                      + (HYBRID_NOTE if hybrid else ""), True)


def is_hybrid(config: Any) -> bool:
    """A model config (config.json's) with layers other than full or sliding-window attention (linear attention)."""
    layer_types = config.get_text_config().to_dict().get("layer_types") or ()  # absent: every layer full attention
    return bool(set(layer_types) - {"full_attention", "sliding_attention"})


def static_cache_bytes(config: Any, batch: int, max_len: int, dtype_bytes: int = 2) -> int:
    """A StaticCache for `batch` sequences of `max_len` tokens: K and V on every attention layer (a sliding-window
    layer's is smaller: an upper bound there) and, on a hybrid's linear-attention layers, each row's state instead:
    the fp32 recurrent state and the short convolution's last kernel-width inputs (memory/generation.py
    linear_state_bytes prices the same for the plan)."""
    return batch * (max_len * kv_bytes_per_token(config, dtype_bytes) + state_bytes_per_row(config, dtype_bytes))


def _layer_types(text: Any) -> list[str]:
    return list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)


def kv_bytes_per_token(config: Any, dtype_bytes: int = 2) -> int:
    """K and V of one token of one sequence, over the layers that keep them (not linear attention)."""
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    layers = sum(t != "linear_attention" for t in _layer_types(text))
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def state_bytes_per_row(config: Any, dtype_bytes: int = 2) -> int:
    """What a hybrid's linear-attention layers hold per sequence, whatever its length; 0 without them."""
    text = config.get_text_config(decoder=True)
    layers = _layer_types(text).count("linear_attention")
    if not layers:
        return 0
    k_heads, v_heads = text.linear_num_key_heads, text.linear_num_value_heads
    k_dim, v_dim = text.linear_key_head_dim, text.linear_value_head_dim
    recurrent = 4 * v_heads * k_dim * v_dim
    conv = dtype_bytes * (2 * k_heads * k_dim + v_heads * v_dim) * text.linear_conv_kernel_dim
    return layers * (recurrent + conv)


def free_device_bytes(device: str) -> int | None:
    """What the device's allocator can still hand out (CUDA: free memory plus what torch holds unused); None on the
    CPU, where the cache comes out of host RAM like any tensor."""
    import torch

    if device != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def cache_kwarg(model: Any) -> str:
    """generate's name for a cache passed in: `cache` (transformers 5.24) or `past_key_values` (5.17)."""
    base = decode_loop.text_model(model)  # a PeftModel's forward is *args
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def static_compile_config() -> Any:
    """transformers' own compile settings (inductor, "reduce-overhead": CUDA graphs) with static shapes: its default
    (dynamic None) lets dynamo turn a dimension dynamic after one recompilation, where a larger cache (the Generator's
    growth) should get a graph of its own shapes instead."""
    from transformers import CompileConfig

    return CompileConfig(dynamic=False)


class StaticDecoder:
    """One static cache for every generate call of a run: built at the first call for that call's batch and
    `max_len` tokens (prompt + new tokens), reset and reused by every later call of the same batch (`builds` counts
    the caches made: 1 for a run whose batch stays fixed). `compile_config`: transformers' CompileConfig for the
    decode step (None: static_compile_config, CUDA graphs on CUDA; the tests compile on the CPU through it).
    `packed_gqa`: decode grouped-query attention without repeat_kv's copies (generation/packed_gqa.py); False is
    transformers' SDPA attention as it is (the benchmark's comparison)."""

    def __init__(self, max_len: int, compile_config: Any = None, packed_gqa: bool = True, own_loop: bool = True):
        self.max_len, self.compile_config, self.packed_gqa = max_len, compile_config, packed_gqa
        self.own_loop = own_loop
        self.attention = "sdpa"  # what the last call decoded with: sdpa, or packed_gqa where it switched
        self.loop = ""  # the last call's loop: decode_loop.LOOP, or generate's with the reason
        self.seconds = 0.0  # wall time in generate (prefill and decode), every call
        self.cache: Any = None
        self.batch = 0
        self.builds = 0
        self.calls = 0

    def stats(self) -> dict[str, int]:
        """For result.json: caches built, generate calls, and (process-wide, dynamo's counters) the graphs compiled
        and the CUDA-graph captures skipped: 1 and 0 when every call replayed one compiled step."""
        from torch._dynamo.utils import counters

        return {"cache_builds": self.builds, "calls": self.calls, "graphs_compiled": counters["stats"]["unique_graphs"],
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"], "attention": self.attention,
                "loop": self.loop, "generate_s": round(self.seconds, 3)}

    def resize(self, max_len: int) -> None:
        """A cache of `max_len` tokens from the next call on (a chat whose conversation outgrew the cache)."""
        self.max_len, self.cache = max_len, None

    def cache_for(self, model: Any, batch: int) -> Any:
        from transformers import StaticCache

        if self.cache is None or batch != self.batch:
            self.cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=self.max_len)
            self.batch, self.builds = batch, self.builds + 1
        else:
            self.cache.reset()  # in place: the compiled step keeps reading the same tensors
        return self.cache

    def generate(self, model: Any, input_ids: Any, generation_config: Any = None, **kwargs: Any) -> Any:
        """`model.generate` on the run's static cache. `generation_config` (the model's when None) is copied, not
        changed; generation keys among `kwargs` go into the copy, the rest (attention_mask) to generate."""
        config = copy.deepcopy(generation_config or model.generation_config)
        kwargs = config.update(**kwargs)
        need = input_ids.shape[1] + config.max_new_tokens
        if need > self.max_len:
            raise ValueError(f"a prompt of {input_ids.shape[1]} tokens + {config.max_new_tokens} new ones exceeds the "
                             f"static cache's {self.max_len}")
        # The cache is ours: generate refuses cache_implementation beside one; TRL's configs say disable_compile.
        config.cache_implementation, config.use_cache, config.disable_compile = None, True, False
        if self.compile_config is not None or model.device.type == "cuda":  # elsewhere transformers would warn
            config.compile_config = self.compile_config or static_compile_config()
        batch = input_ids.shape[0] * max(config.num_return_sequences or 1, config.num_beams or 1)
        cache, key = self.cache_for(model, batch), cache_kwarg(model)
        self.calls += 1
        t0 = time.perf_counter()
        with without_input_grad_hooks(model), packed_gqa_decoding(model, self.packed_gqa) as packed:
            self.attention = "packed_gqa" if packed else "sdpa"
            call, why = decode_loop.prepare(model, input_ids, config, kwargs, key, cache) if self.own_loop else (
                None, "own_loop off")
            self.loop = decode_loop.LOOP if call else f"{decode_loop.GENERATE} ({why})"
            if call is not None:
                out = decode_loop.decode(model, input_ids, kwargs["attention_mask"], call, key, cache, self.max_len)
            else:
                out = model.generate(input_ids=input_ids, generation_config=config, **{key: cache}, **kwargs)
        self.seconds += time.perf_counter() - t0  # both loops read the GPU's last tokens before returning
        return out


INPUT_GRAD_HOOK = "make_inputs_require_grads"  # transformers' enable_input_require_grads hook (5.17 and 5.24)


@contextmanager
def without_input_grad_hooks(model: Any) -> Iterator[None]:
    """The input embeddings' `requires_grad_` forward hooks (transformers' enable_input_require_grads, which PEFT and
    the Trainer's gradient checkpointing install, each once) off for the block: dynamo cannot trace requires_grad_,
    and a break in the compiled decode step splits it into graphs that CUDA graphs then skip (a grpo stage on the
    H200: 16 graphs, cudagraphs skipped for mutated inputs, 373 generated tokens/s against 2,888 for the same
    decode outside the trainer). Under no_grad the hook does nothing anyway. By name, not by the handles: a second
    enable_input_require_grads overwrites the first's handle, so disable_input_require_grads would leave one."""
    base = decode_loop.text_model(model)
    embeddings = base.get_input_embeddings()
    hooks = embeddings._forward_hooks  # torch's own registry; no public API lists a module's hooks
    taken = {key: hook for key, hook in hooks.items() if getattr(hook, "__name__", "") == INPUT_GRAD_HOOK}
    for key in taken:
        del hooks[key]
    try:
        yield
    finally:
        hooks.update(taken)
