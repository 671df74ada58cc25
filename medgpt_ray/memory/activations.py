"""What one training stage keeps on the GPU per token: the activations saved for backward, what checkpointing
rebuilds, the backward's working set, and the loss's transient memory (terms of estimator.estimate)."""

from __future__ import annotations

from collections import Counter

from medgpt_ray.memory.profiles import memory_profile
from medgpt_ray.memory.setup import TrainSetup
from medgpt_ray.memory.shapes import ModelShape

# Chunked LM heads (TRL's fused head, Liger's fused linear CE) keep a few hidden-size fp32 buffers per token.
FUSED_HEAD_BYTES_PER_HIDDEN = 12
# Packed SFT rows (stages/packing.py) carry no attention mask; transformers builds a block-diagonal [rows, 1, L, L]
# mask from the position ids, and SDPA's kernel for masked attention takes it as an additive bias that each layer
# saves for backward. Measured on the H200 (Qwen2.5-1.5B LoRA, 3 packed rows of 2048, no checkpointing, compiled):
# 21.70 GiB against 20.30 predicted without this term, 4.3 bytes per mask element per layer.
PACKED_MASK_BYTES_PER_ELEMENT = 4.5
# bitsandbytes' 4-bit layers keep ~15% less per token than bf16 LoRA layers (7B SFT/DPO, 1.5B SFT).
QLORA_ACTIVATION_SCALE = 0.85
LORA_UNATTRIBUTED_BYTES_PER_HIDDEN = 8
# A hybrid's (Qwen3.5's) layers keep ~11-23 KiB a token and layer more than the terms below derive: the fake-tensor
# trace of the whole 0.75B step (bench/fake_trace.py) against them, LoRA at 1,024 tokens with no layer checkpointed
# and at 2,048 with 37.5 % of them, full at 2,048 with half; the GPU matches that trace (the H100's allocator within
# 3 %, the H200's two SFT runs within 0.1 %: bench/README.md, "fake_trace.py"). Not yet attributed to tensors; per
# hidden element, a little over the largest gap. On flash-linear-attention's kernels (_linear_kernel_bytes) it is not
# added: the H100's packed 0.8B LoRA step at 3 x 2,048 with 37.5 % checkpointed peaked at 10.27 GiB, where the terms
# with it give 13.68 and without it 11.57 (bench/results/hybrid_h100_call2/; no trace of the kernel path yet).
HYBRID_UNATTRIBUTED_BYTES_PER_HIDDEN = 24


# Gated DeltaNet (Qwen3.5's linear attention) through transformers' PyTorch fallbacks (torch_chunk_gated_delta_rule and
# the F.conv1d causal convolution; the GPU image has neither flash-linear-attention nor causal-conv1d): what one layer
# keeps, per token, read tensor by tensor from the code (5.17 and 5.24 run the same chunked rule) and checked against
# a fake-tensor trace of the layer (bench/fake_trace.py; tests/unit/test_fake_trace_memory.py). The rule works in fp32
# on chunks of DELTA_RULE_CHUNK tokens: [chunk x chunk] matrices per value head, and one fp32 [key_head_dim x
# value_head_dim] state per value head and chunk, saved for backward (so the states scale with tokens / chunk).
DELTA_RULE_CHUNK = 64
DELTA_RULE_CHUNK_MATRICES = 5  # the pairwise decay, the two [chunk x chunk] products and their decayed copies
# Nothing more is counted for the fallback: the H200's 7.99 GiB that once looked like a GPU-only excess was the packed
# plan's checkpointing (37.5 % of the layers) trained where the plan said all (fixed in kinds/sft/stage.py); the
# fake-tensor trace at what ran gives 8.00, and the H100's allocator gives the trace's peak (bench/README.md).


def layer_kinds(shape: ModelShape) -> list[tuple[bool, bool]]:
    """Each layer's (linear attention, routed MLP), in order: a dense model's are all (False, False)."""
    linear, moe = set(shape.linear_layers), set(shape.moe_layers)
    return [(i in linear, i in moe) for i in range(shape.layers)]


def _mixer_bytes(shape: ModelShape, e: int, linear: bool, kernels: bool = False) -> float:
    """What the attention (or linear-attention) block saves per token, inside the layer (`kernels`: a linear layer
    on flash-linear-attention's kernels, else on transformers' PyTorch reference)."""
    if linear:
        return _linear_kernel_bytes(shape, e) if kernels else _linear_attention_bytes(shape, e)
    # SDPA keeps q, k, v, out (+ fp32 logsumexp), each heads x head_dim wide (q_dim: the hidden size in Qwen2.5,
    # twice it in Qwen3-30B-A3B and Qwen3.5). HF repeats k/v to every head before SDPA whenever the batch carries an
    # attention mask, which every stage's collator passes: GQA's small k/v save nothing here.
    # Qwen3.5's gated attention also keeps the output and the sigmoid of its gate.
    return e * 4 * shape.q_dim + 4 * shape.heads + (2 * e * shape.q_dim if shape.q_gate else 0)


def _linear_attention_bytes(shape: ModelShape, e: int) -> float:
    """A Gated-DeltaNet layer's own terms instead of attention's, per token (the DELTA_RULE_CHUNK comment says
    where they come from): the causal convolution's input and SiLU's input (q, k, v in one of 2k + v); the fp32 copy
    of the gate z SiLU keeps; in fp32 inside the rule, q and k before their L2 norm, q, k, v as the chunks read
    them, beta * k, the two triangular solves' outputs, the decayed q and k the scan reads, each chunk's corrected
    values; the chunk matrices; one recurrent state per chunk; the gated RMSNorm's fp32 input, gate and output."""
    k, v, nv = shape.linear_key_dim, shape.linear_value_dim, shape.linear_value_heads
    kr = nv * shape.linear_key_head_dim  # q and k repeated to the value heads
    conv = 2 * e * (2 * k + v)
    chunk_matrices = 4 * nv * DELTA_RULE_CHUNK * DELTA_RULE_CHUNK_MATRICES
    rule = 4 * (2 * kr + (2 * kr + v) + kr + (v + kr) + 2 * kr + v) + chunk_matrices
    state = 4 * nv * shape.linear_key_head_dim * shape.linear_value_head_dim / DELTA_RULE_CHUNK
    return conv + rule + state + _gated_norm_bytes(shape, e)


def _gated_norm_bytes(shape: ModelShape, e: int) -> float:
    """A Gated-DeltaNet layer's fp32 copy of the gate z SiLU keeps and the gated RMSNorm's fp32 input, gate and
    output, with beta, the decay and their per-head fp32 exps: the same on either path."""
    v = shape.linear_value_dim
    return 4 * v + (4 + 4 + e) * v + 32 * shape.linear_value_heads


def _linear_kernel_bytes(shape: ModelShape, e: int) -> float:
    """A Gated-DeltaNet layer on flash-linear-attention's kernels (hybrid/mixing.mix_kernels), per token: fla's causal
    convolution keeps its input and its SiLU'd output (q, k, v, which the rule keeps as they are); the chunked rule
    keeps besides them only bf16 per-head values (beta, its [chunk] solve A) and fp32 ones (g's cumulative sum, q's and
    k's L2-norm scales), and recomputes its states in backward; the gated RMSNorm's fp32 terms as on the reference."""
    k, v, nv = shape.linear_key_dim, shape.linear_value_dim, shape.linear_value_heads
    conv = 2 * e * (2 * k + v)
    rule = nv * (e + e * DELTA_RULE_CHUNK + 4 + 8)
    return conv + rule + _gated_norm_bytes(shape, e)


def _mlp_bytes(shape: ModelShape, s: TrainSetup, e: int, moe: bool) -> float:
    """What the MLP saves per token: a dense SwiGLU of `intermediate`, or a routed layer's active experts."""
    if not moe:
        # SiLU's input, its output and the up projection, for the product's backward; Liger's SwiGLU keeps the
        # two projections and recomputes SiLU.
        return e * (2 if s.fused_kernels else 3) * shape.intermediate
    k, h = shape.experts_per_token, shape.hidden
    # The SwiGLU of each of the k active experts and of the shared expert (Liger patches the dense MLP only), each
    # active expert's output (kept for its routing weight's gradient), the shared expert's (for its sigmoid gate).
    swiglu = e * 3 * shape.routed_width + e * k * h + (e * h if shape.shared_expert_intermediate else 0)
    # The router: logits over every expert and their fp32 softmax; the top-k fp32 weights, int64 indices and the
    # int64 token positions each active expert gathers. Scales with the experts only here, [tokens x experts].
    router = (e + 4) * shape.experts + (4 + 8 + 8) * k
    return swiglu + router


def _linear_inputs(shape: ModelShape, s: TrainSetup, linear: bool, moe: bool) -> int:
    """Elements per token of the inputs a layer's matmuls keep for weight grads (full) or for bitsandbytes' 4-bit
    matmul (QLoRA): the mixer's (its input, its output projection's) and the MLP's."""
    h = shape.hidden
    mixer = h + shape.linear_value_dim if linear else 2 * h
    if not moe:
        return mixer + h + shape.intermediate
    shared = h + shape.shared_expert_intermediate  # the router's and the shared expert's input; its down_proj's
    if s.method == "qlora":
        return mixer + shared  # the routed experts stay 16-bit and frozen: no input kept for them
    return mixer + shared + shape.experts_per_token * (h + shape.moe_intermediate)


def _lora_bytes(shape: ModelShape, s: TrainSetup, e: int, linear: bool, moe: bool) -> float:
    """LoRA: the bf16 copy of each adapted input (after dropout) that lora_A saves, and lora_B's input."""
    h, r = shape.hidden, s.lora_rank
    if not (linear or moe or shape.lora_targets):  # attention + dense MLP under all-linear, as calibrated
        return e * (6 * h + shape.intermediate) + 7 * e * r
    mixer = shape.linear_attention_linears() if linear else shape.attention_linears()
    adapted = shape.lora_adapted(mixer) + shape.lora_adapted(shape.mlp_linears(moe))
    return e * sum(a + r for _, a, _ in adapted)  # what config/lora_targets.py adapts, input by input


def layer_activation_bytes(shape: ModelShape, s: TrainSetup, linear: bool = False, moe: bool = False) -> float:
    """Bytes one decoder layer saves for backward, per token: an attention layer with a dense MLP unless `linear`
    (a hybrid's linear-attention layer) or `moe` (a routed MLP)."""
    h = shape.hidden
    deepspeed = s.zero > 0 and s.method == "full"
    # The residual stream is fp32 when fp32 weights run under autocast (HF's bf16=True); DeepSpeed casts to bf16.
    stream = 4 if (s.precision in ("amp-bf16", "fp32") and not deepspeed) else 2
    e = 4 if s.precision == "fp32" else 2  # activations inside the layer (autocast -> bf16)
    trainable_base = s.method == "full"
    # RMSNorm: its fp32 input, and the normalized tensor when the norm weight is trained. Liger's kernel keeps
    # only its input as it came (and a per-row fp32 rstd) and derives the weight grad from it.
    norm = stream * h + 4 if s.fused_kernels else 4 * h + (stream * h if trainable_base else 0)
    total = 2 * norm + _mixer_bytes(shape, e, linear, bool(s.linear_kernels)) + _mlp_bytes(shape, s, e, moe)
    if trainable_base or s.method == "qlora":
        total += e * _linear_inputs(shape, s, linear, moe)
    if s.method != "full":
        total += _lora_bytes(shape, s, e, linear, moe)
        # Unattributed, measured: bf16 LoRA layers keep ~8h bytes/token more than the terms above account
        # for (0.5B, 1.5B: 7-14h; 7B: ~3h). Kept on the safe side for the large models.
        total += LORA_UNATTRIBUTED_BYTES_PER_HIDDEN * h
    if shape.linear_layers and not s.linear_kernels:  # fitted on the reference's trace (see the constant)
        total += HYBRID_UNATTRIBUTED_BYTES_PER_HIDDEN * h
    return total


def loss_bytes(shape: ModelShape, s: TrainSetup, trainable_head: bool) -> float:
    """Transient memory of the loss at the start of backward."""
    tokens = s.tokens()
    profile = memory_profile(s.stage)
    if profile.score_head:
        return 0.0  # the score head gives one number per sequence
    if profile.chunked_head or s.fused_ce:
        head = shape.vocab * shape.hidden
        head_grad = 4 * head if (trainable_head and profile.fused_ce_head_grad) else 0
        if trainable_head and profile.chunked_head and s.precision == "bf16":
            # TRL's chunked head over bf16 weights sums the head's gradient in an fp32 buffer and hands back a bf16
            # copy: both live at the loss (fake-traced on the 0.75B Qwen3.5, whose H200 full run it matched within
            # 0.1 %: bench/results/fake_trace_qwen3.5-0.8b_full_*). Under amp-bf16 the fp32 gradient is the buffer.
            head_grad = max(head_grad, (4 + 2) * head)
        return FUSED_HEAD_BYTES_PER_HIDDEN * tokens * shape.hidden + head_grad
    return profile.loss_bytes_per_logit(s.nll_term) * tokens * shape.vocab


def activation_terms(shape: ModelShape, s: TrainSetup) -> dict[str, float]:
    """What the forward saves for backward, what checkpointing rebuilds, and the backward's working set."""
    full, deepspeed = s.method == "full", s.zero > 0
    profile = memory_profile(s.stage)
    b: dict[str, float] = {}
    tokens = s.tokens()
    scale = profile.scale_for(s.method) * (QLORA_ACTIVATION_SCALE if s.method == "qlora" else 1.0)
    kinds = layer_kinds(shape)
    per_kind = {kind: layer_activation_bytes(shape, s, *kind) for kind in dict.fromkeys(kinds)}
    if s.compiled:
        per_kind = {kind: per_layer * profile.compiled_layer_scale for kind, per_layer in per_kind.items()}
    stream = 4 if (s.precision in ("amp-bf16", "fp32") and not (deepspeed and full)) else 2
    k = round(s.ckpt_fraction * shape.layers)
    live = Counter(kinds[k:])  # the layers after the first k (checkpointed) ones, by kind
    saved = sum(n * per_kind[kind] for kind, n in live.items()) + k * stream * shape.hidden
    # A checkpointed layer rebuilds its activations during its backward. The checkpointed layers are the first
    # ones, reached last by backward, when the later layers' activations are already freed: the rebuild only
    # adds to the peak when every layer is checkpointed (then the largest layer's).
    recompute = max(per_kind.values()) if k == shape.layers else 0
    # Around the layers: embedding output and final norm; the LM head input when the head trains.
    edges = (2 * stream + 4) * shape.hidden + (2 * shape.hidden if full else 0)
    b["activations"] = tokens * (saved + edges) * scale
    if s.packed and s.attention != "flex":  # micro_batch packed rows; rm's are 2 x seq_len wide (the tokens are
        # those of micro_batch pairs). Flex attention's BlockMask holds a few bytes per 128 x 128 block instead.
        width = s.seq_len * profile.packed_row_sequences
        attention = sum(n for (linear, _), n in live.items() if not linear)  # linear attention takes no mask
        b["packed_attention_mask"] = PACKED_MASK_BYTES_PER_ELEMENT * s.micro_batch * width ** 2 * max(attention, 1)
    b["recompute"] = tokens * recompute * scale
    # The gradients in flight inside the layer being back-propagated (SwiGLU's three, the attention output's), at
    # the widest MLP a token runs through (a routed layer's: its active experts' and shared expert's).
    e = 4 if s.precision == "fp32" else 2
    b["backward_working_set"] = tokens * e * (3 * shape.mlp_width + 2 * shape.hidden) * scale
    return b
