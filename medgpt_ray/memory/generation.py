"""GRPO's and RLOO's peak GPU memory (memory kind grpo): the larger of their two phases.

  generation  weights + optimizer states (+ a frozen reference copy, full training with beta > 0) + the reward
              model when it is a network (rloo: always) + the KV cache of one generate call: 2 (K, V) x full-attention
              layers x kv_heads x head_dim x bytes x generation batch (completions: prompts x num_generations) x
              (prompt + completion) tokens (a hybrid's linear-attention layers: a fixed state per sequence
              instead), + the sampling logits of the batch (fp32) and the prefill's one-layer working set; the
              KV cache is priced at its full length for the whole batch, which is what the static decode path
              (generation/decode_path.py) allocates up front and the dynamic one reaches at the last token; on the
              static path compiled on a GPU, + the CUDA-graph pool of the compiled decode step (cuda_graph_pool_bytes).
              That path's KV cache and CUDA-graph pool are made once and kept for the run (a new cache would make
              the graphs re-record), so both are resident in every phase below as well
  training    the training pass over the generated sequences (prompt + completion, micro-batch sequences), as
              SFT's with TRL's chunked LM head (estimator.estimate), + the reward model's weights
  merge       a LoRA policy's rollouts run on the merged adapter: the resident terms and PEFT's merge of the widest
              adapted layer (B @ A and its scaled copy in fp32), before the generation's cache exists
  scoring     with a shared base (reward_shared_base, stages/reward_adapter.py) the reward model is no network: the
              rm's LoRA adapter (fp32, as PEFT holds adapters) + score head sit in both phases above, and scoring is
              a third moment: weights + optimizer states + adapter + one no-grad forward of SCORING_BATCH sequences
              (the separate network's scoring forward is not a phase of its own: the measured peaks stayed under)

`peak(shape, setup)` is the estimate the planner uses for every kind: estimator.estimate unless the setup generates.
The generation batch per worker is micro_batch x steps_per_generation, which the planner chooses (generation_choices:
the largest that fits is the fastest, memory/throughput.py). Measured on the H200 under a 24 GiB cap
(bench/results/rl_stage_run_*): 1.5B grpo 16.57 GiB (21.18 predicted), rloo 18.58 (19.57), 7B grpo 21.02 (21.78)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from medgpt_ray.memory.decode_terms import decode_path, expanded_kv_bytes, kv_cache_bytes
from medgpt_ray.memory.estimator import RUNTIME_OVERHEAD_BYTES, Estimate, TrainSetup, estimate
from medgpt_ray.memory.rollout_host import EXPERTS_UNMERGED, host_note
from medgpt_ray.memory.setup import merges_adapters
from medgpt_ray.memory.shapes import ModelShape

SCORING_BATCH = 16  # sequences a reward model scores per forward (stages/rewards.py, stages/reward_adapter.py)


def generation_choices(s: TrainSetup):
    """`s` with each generation batch the planner may choose (TRL's steps_per_generation: micro-batches per generate
    call, a divisor of grad_accum), each call holding whole groups of `s.generations` completions (a worker's share
    of TRL's group normalisation, trainer_kit/prompt_shard.py); just `s` for a stage that does not generate. Fewer
    micro-batches per call: a smaller KV cache, more calls (memory/throughput.py prices each)."""
    if not s.generations or s.gen_steps:  # gen_steps set: the kind's trainer fixes it (opd: every micro-batch)
        yield s
        return
    for d in range(1, s.grad_accum + 1):
        if s.grad_accum % d == 0 and (s.micro_batch * d) % s.generations == 0:
            yield replace(s, gen_steps=d)


def rollout_path(s: TrainSetup) -> str | None:
    """What a generating stage's rollouts decode with (trainer_kit/merged_rollouts.py), for plan.json and the plan's
    line; None for a stage that does not generate. A merge needs no GPU memory beyond one layer's delta: the base is
    restored from a host copy of the adapted layers' weights."""
    if not s.generations:
        return None
    if merges_adapters(s):
        kept = f", {EXPERTS_UNMERGED}" if s.lora_experts and not s.merge_experts else ""
        return f"merged LoRA{kept} (PEFT's merge per generate call, the base restored bit-exact from a host copy)"
    if s.method == "full":
        return "the trained weights"
    if s.method == "qlora":
        return "unmerged adapters (a 4-bit QLoRA base takes no merge)"
    return "unmerged adapters (ZeRO-3: the weights are partitions outside the generate call's gather)"


def rollout_line(shape: ModelShape, s: TrainSetup, host_room_gib: float | None = None) -> str | None:
    """plan.json's `rollout` and the plan line's: the weights the rollouts decode (rollout_path), a merge's host RAM
    per worker against `host_room_gib` (memory/rollout_host.py; None: not known) and the decode path with its
    reason."""
    path = decode_path(shape, s)
    if path is None:
        return None
    host = host_note(shape, s, host_room_gib) if merges_adapters(s) else ""
    return f"{rollout_path(s)}{host}; decode: {path.describe()}"


def cuda_graph_pool_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """The CUDA-graph pool of the compiled decode step (the static path on a GPU; 0 elsewhere): a graph's memory
    stays reserved between replays, sized by the step's largest live set at the generation batch B with one token
    per sequence: one decoder layer's activations (hidden in and out, norm, q/k/v, attention output, gate, up and
    their product: (4 hidden + q + 2 kv + 3 mlp_width) x B elements), attention scores and probabilities over the
    cache's full length in fp32 where SDPA takes its math path (2 x 4 x B x heads x seq_len), the 4-D mask
    (B x seq_len, fp32 at most) and the logits the graph outputs (B x vocab), doubled (inductor's buffers and the
    graphs captured for a second batch shape are not modelled); and K and V repeated to every head over the full
    length (expanded_kv_bytes), once. Checked against the allocator's peaks on the H200 (7B and 1.5B, 16 and 64
    sequences, bench/generation_throughput.py); the pool's reserved size itself is not yet measured."""
    path = decode_path(shape, s)
    if path is None or not path.compiled:
        return 0.0
    e = 4 if s.precision == "fp32" else 2
    b = s.generation_batch()
    layer = e * b * (4 * shape.hidden + shape.q_dim + 2 * shape.kv_dim + 3 * shape.mlp_width)
    scores = 2 * 4 * b * shape.heads * s.seq_len
    return 2 * (layer + scores + 4 * b * s.seq_len + e * b * shape.vocab) + expanded_kv_bytes(shape, s)


def merge_delta_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """The merged-rollout moment's transient (trainer_kit/merged_rollouts.py): PEFT's merge of the widest adapted
    layer holds B @ A and its scaled copy, both in the adapters' fp32, while it adds them into the base; 0 where
    the rollouts do not merge."""
    if not merges_adapters(s):
        return 0.0
    widest = max(shape.mlp_width, shape.heads * max(shape.head_dim, shape.hidden // shape.heads)) * shape.hidden
    if s.lora_experts and s.merge_experts:  # lora.experts: a routed layer's whole fused gate_up tensor at once
        widest = max(widest, shape.experts * 2 * shape.moe_intermediate * shape.hidden)
    return 2 * 4 * widest


def linear_state_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """What a hybrid's linear-attention layers hold per sequence instead of a cache that grows: the fp32 recurrent
    state [value_heads x key_head_dim x value_head_dim] and the causal convolution's last kernel-width inputs (of
    the q, k, v projection: 2k + v wide); 0 for a model without linear attention."""
    e = 4 if s.precision == "fp32" else 2
    recurrent = 4 * shape.linear_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim
    conv = e * (2 * shape.linear_key_dim + shape.linear_value_dim) * shape.linear_conv_kernel
    return len(shape.linear_layers) * (recurrent + conv) * s.generation_batch()


def reward_network_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """The rm stage's merged model (same base shape, a 1-wide score head instead of the LM head), no grad."""
    if not s.reward_network:
        return 0.0
    return (4 if s.precision == "fp32" else 2) * (shape.params - shape.head_params + shape.hidden)


def reward_adapter_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """The rm stage's LoRA adapter on the policy's base (PEFT holds it in fp32; at the rm's own rank, this stage's
    when unknown) and its 1-wide score head."""
    if not s.reward_adapter:
        return 0.0
    rank = s.reward_lora_rank or s.lora_rank
    return 4 * shape.lora_params(rank) + (4 if s.precision == "fp32" else 2) * shape.hidden


def scoring_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """One no-grad scoring forward's working set: SCORING_BATCH sequences of seq_len through one layer. On the
    shared base PEFT's mixed-batch forward also copies each adapted input (x[rows], then cast to the fp32
    adapter's dtype): at the widest, down_proj's, 2 + 4 bytes per element beside the input itself."""
    e = 4 if s.precision == "fp32" else 2
    mixed = (e + 4) * SCORING_BATCH * s.seq_len * shape.mlp_width if s.reward_adapter else 0
    return e * SCORING_BATCH * s.seq_len * (4 * shape.hidden + 3 * shape.mlp_width) + mixed


def peak(shape: ModelShape, s: TrainSetup) -> Estimate:
    """The stage's peak: estimator.estimate's, or for a generating stage (GRPO) the larger of its two phases."""
    # The setup carries the phase: the kinds' setup fields set it (kinds/<kind>/memory.py).
    return estimate_grpo(shape, s) if s.generations else estimate(shape, s)


def generate_call_terms(shape: ModelShape, s: TrainSetup) -> dict[str, float]:
    """What one generate call holds beside the networks: the KV cache at full length, the compiled step's CUDA-graph
    pool or else the eager decode steps' repeated K/V (the compiled step's are in its pool), a hybrid's
    linear-attention state, the sampling logits (fp32, twice) and the prefill's one-layer working set."""
    e = 4 if s.precision == "fp32" else 2
    prompt_len = max(s.seq_len - s.completion_len, 1)
    pool = cuda_graph_pool_bytes(shape, s)
    return {
        "kv_cache": kv_cache_bytes(shape, s),
        "cuda_graph_pool": pool,
        "decode_expanded_kv": 0.0 if pool else expanded_kv_bytes(shape, s),
        "linear_attention_state": linear_state_bytes(shape, s),
        "sampling_logits": 2 * 4 * s.generation_batch() * shape.vocab,
        "prefill_working_set": e * s.generation_batch() * prompt_len * (4 * shape.hidden + 3 * shape.mlp_width),
    }


def estimate_grpo(shape: ModelShape, s: TrainSetup) -> Estimate:
    train_setup = replace(s, generations=0)  # the training pass: estimator's own terms for memory kind grpo
    train = estimate(shape, train_setup)
    rm, adapter = reward_network_bytes(shape, s), reward_adapter_bytes(shape, s)
    training = {**train.breakdown, **({"reward_model": rm} if rm else {}), **({"reward_adapter": adapter} if adapter
                                                                              else {})}
    static_keys = ("weights", "master_weights", "optimizer_states", "reference_model", "zero_buffers",
                   "gathered_parameters",  # ZeRO-3 gathers parameters for generation's forwards too
                   *(s.kind_terms(shape, s).resident if s.kind_terms else ()))  # a kind's own resident networks
    generation = {k: v for k, v in train.breakdown.items() if k in static_keys}
    if s.reference and s.method == "full" and "reference_model" not in generation:
        generation["reference_model"] = (4 if s.precision in ("amp-bf16", "fp32") else 2) * shape.params
        training["reference_model"] = generation["reference_model"]
    generation.update({"reward_model": rm, "reward_adapter": adapter, **generate_call_terms(shape, s),
                       "runtime_overhead": RUNTIME_OVERHEAD_BYTES})
    if cuda_graph_pool_bytes(shape, s):  # compiled static path: its cache and graphs stay between rollouts
        static_keys = (*static_keys, "kv_cache", "cuda_graph_pool")
        training.update({k: generation[k] for k in ("kv_cache", "cuda_graph_pool")})
    phases = [(training, f"training ({train.moment})"), (generation, "generation")]
    if merge := merge_delta_bytes(shape, s):  # before generation's cache exists: the static terms and the delta
        phases.append(({**{k: v for k, v in generation.items() if k in static_keys or k in ("reward_model",
                                                                                       "reward_adapter")},
                        "lora_merge_delta": merge, "runtime_overhead": RUNTIME_OVERHEAD_BYTES}, "rollout merge"))
    if adapter:
        phases.append(({**{k: v for k, v in generation.items() if k in (*static_keys, "reward_adapter")},
                        "scoring_forward": scoring_bytes(shape, s), "runtime_overhead": RUNTIME_OVERHEAD_BYTES},
                       "reward scoring"))
    terms, moment = max(phases, key=lambda p: sum(p[0].values()))  # the first of equals: training
    return Estimate(sum(terms.values()), {k: v for k, v in terms.items() if v}, moment, train.host_bytes)


def _size_text(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 / 10 else f"{size / 2**20:.1f} MiB"  # MiB: the tiny model


def reward_model_placement(shape: ModelShape, s: TrainSetup, use_gpu: bool, usable_gib: float | None) -> str | None:
    """Where the reward model is held (plan.json's reward_model_on), None without one: beside the policy on every
    training worker's device, as an adapter on the policy's own base there (shared base), or (reward_model_gpu) in
    an actor on a device of its own, which must then hold the network and one scoring forward; ValueError with the
    numbers when that GPU is too small."""
    own = s.reward_model_gpu
    where = "the GPU" if use_gpu else "the CPU memory"
    if s.reward_adapter:
        return (f"the policy's own base (shared base): the rm stage's LoRA adapter + score head in {where} of each "
                f"training worker ({_size_text(reward_adapter_bytes(shape, s))}; a scoring forward of "
                f"{SCORING_BATCH} x {s.seq_len} tokens {_size_text(scoring_bytes(shape, s))}), no second network")
    if not (s.reward_network or own):
        return None
    size = reward_network_bytes(shape, replace(s, reward_network=True))
    size_text = _size_text(size)
    if not own:
        return f"{where} of each training worker, beside the policy ({size_text})"
    need = (size + scoring_bytes(shape, replace(s, reward_adapter=False)) + RUNTIME_OVERHEAD_BYTES) / 2**30
    if use_gpu and usable_gib is not None and need > usable_gib:
        raise ValueError(f"reward_model_gpu: the reward model's own GPU needs {need:.1f} GiB (network {size_text}, "
                         f"scoring {SCORING_BATCH} x {s.seq_len} tokens) of {usable_gib:.1f} GiB usable")
    where = "a GPU of its own (a Ray actor; the placement picks it)" if use_gpu else "a Ray actor of its own (CPU)"
    return f"{where}: {size_text}, {need:.2f} GiB with one scoring forward"


def rl_hints(shape: ModelShape, s: TrainSetup, usable_gib: float,
             kind_hints: Sequence[tuple[str, dict[str, Any]]] = ()) -> list[str]:
    """What a generating stage that fits nowhere could change: fewer generations per prompt (the generation batch
    shrinks with them: fewer prompts per step), the kind's own hints (`kind_hints`, its memory module's: shorter
    completions, opd's 4-bit teacher), QLoRA, or (with a reward network) a second GPU
    for the reward model (reward_model_gpu) or, for a LoRA policy, the rm's adapter on the policy's base
    (reward_shared_base); each with its predicted peak (reward_model_gpu's: the policy's GPU without the reward
    model)."""
    if not s.generations:
        return []
    options = []
    for g in (s.generations // 2, s.generations // 4):
        if g >= 2 and s.micro_batch * s.grad_accum * g // s.generations >= 1:
            fewer = replace(s, generations=g, grad_accum=max(s.grad_accum * g // s.generations, 1), gen_steps=0)
            options.append((f"num_generations {g} (same prompts per step)",
                            min(generation_choices(fewer), key=TrainSetup.generation_batch, default=fewer)))
    options += [(label, replace(s, **fields)) for label, fields in kind_hints]
    if s.method != "qlora" and s.precision != "fp32":
        options.append(("method qlora", replace(s, method="qlora", precision="bf16", zero=0, offload="none")))
    if s.reward_network:
        options.append(("reward_model_gpu: true (the reward model on a GPU of its own)",
                        replace(s, reward_network=False)))
        if s.method != "full":
            options.append(("rm with LoRA from this stage's `from` (reward_shared_base: its adapter on the policy's "
                            "base, no second network)", replace(s, reward_network=False, reward_adapter=True)))
    out = []
    for label, setup in options:
        gib = peak(shape, setup).peak_gib
        out.append(f"{label}: {gib:.1f} GiB ({'fits' if gib <= usable_gib else 'still over'})")
    return out
