"""The peak-memory estimator: closed forms per parameter, ZeRO partitioning, and monotonicity."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from medgpt_ray.memory.estimator import (
    NF4_BYTES_PER_PARAM,
    RUNTIME_OVERHEAD_BYTES,
    SetupError,
    TrainSetup,
    estimate,
)
from medgpt_ray.memory.shapes import PRESETS, ShapeError, load_shape
from medgpt_ray.memory.zero3 import gather_elements

Q05, Q7 = PRESETS["qwen2.5-0.5b"], PRESETS["qwen2.5-7b"]


def setup(**kw) -> TrainSetup:
    base = dict(stage="sft", method="lora", precision="bf16", micro_batch=1, seq_len=1024, ckpt_fraction=1.0)
    return TrainSetup(**{**base, **kw})


def test_preset_parameter_counts_match_the_published_models():
    # Qwen2.5-0.5B 494M, 1.5B 1.54B, 7B 7.62B, Llama-2-7B 6.74B (their model cards).
    assert round(PRESETS["qwen2.5-0.5b"].params / 1e6) == 494
    assert round(PRESETS["qwen2.5-1.5b"].params / 1e7) == 154
    assert round(PRESETS["qwen2.5-7b"].params / 1e7) == 762
    assert round(PRESETS["llama2-7b"].params / 1e7) == 674


def test_shape_is_read_from_config_json_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "tie_word_embeddings": True}))
    s = load_shape(str(tmp_path))
    assert (s.vocab, s.hidden, s.layers, s.kv_heads, s.tied_embeddings) == (1000, 64, 3, 2, True)
    with pytest.raises(ShapeError, match="neither a preset"):
        load_shape(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ShapeError, match="config.json: no .num_attention_heads"):
        load_shape(str(tmp_path))


def test_full_amp_static_memory_is_16_bytes_per_parameter():
    # fp32 weights (4) + fp32 grads (4) + AdamW's two fp32 moments (8): the optimizer step's peak.
    est = estimate(Q05, setup(method="full", precision="amp-bf16", seq_len=8))
    assert est.moment == "optimizer step"
    assert est.breakdown["weights"] == 4 * Q05.params
    assert est.breakdown["optimizer_states"] == 8 * Q05.params
    assert est.breakdown["gradients"] == 4 * Q05.params
    assert est.peak_bytes == 16 * Q05.params + RUNTIME_OVERHEAD_BYTES


def test_pure_bf16_full_training_keeps_everything_in_bf16():
    est = estimate(Q05, setup(method="full", precision="bf16", seq_len=8, grad_accum=2))  # all grads live
    assert est.breakdown["weights"] == 2 * Q05.params
    assert est.breakdown["optimizer_states"] == 4 * Q05.params  # torch AdamW states follow the param dtype
    assert est.breakdown["gradients"] == 2 * Q05.params


def test_lora_and_qlora_weights():
    lora = estimate(Q7, setup(method="lora")).breakdown
    adapters = Q7.lora_params(8)
    assert lora["weights"] == 2 * Q7.params + 4 * adapters
    assert lora["optimizer_states"] == 8 * adapters
    qlora = estimate(Q7, setup(method="qlora")).breakdown
    # NF4 linears; embeddings, LM head, norms stay 16-bit; adapters fp32.
    expected = NF4_BYTES_PER_PARAM * Q7.linear_params + 2 * (Q7.params - Q7.linear_params) + 4 * adapters
    assert qlora["weights"] == pytest.approx(expected)
    assert qlora["weights"] < 0.4 * lora["weights"]


def test_zero_partitions_states_over_the_gpus():
    one = estimate(Q05, setup(method="full", precision="amp-bf16", zero=2, gpus=1, seq_len=8)).breakdown
    four = estimate(Q05, setup(method="full", precision="amp-bf16", zero=2, gpus=4, seq_len=8)).breakdown
    assert four["optimizer_states"] == pytest.approx(one["optimizer_states"] / 4)
    assert four["master_weights"] == pytest.approx(one["master_weights"] / 4)
    assert four["weights"] == one["weights"] == 2 * Q05.params  # ZeRO-2 keeps bf16 weights whole
    z3 = estimate(Q05, setup(method="full", precision="amp-bf16", zero=3, gpus=4, seq_len=8)).breakdown
    assert z3["weights"] == pytest.approx(2 * Q05.params / 4)
    # DeepSpeed keeps a parameter gathered when it is used again within stage3_max_reuse_distance (1e9) elements:
    # a 0.5B model's whole forward-and-backward trace is within it, so ZeRO-3 holds all of it whole while it runs.
    whole = gather_elements(Q05, 1.0)
    assert whole.peak_elements == Q05.params - Q05.small_params  # norms, biases: never partitioned
    # and over 4 ranks, for a moment, a gathered group's flat buffer beside the copies made out of it
    assert z3["gathered_parameters"] == 2 * whole.peak_with_buffers > 2 * whole.peak_elements
    for shape in (Q05, Q7):
        z1, z2, z3_peak = (estimate(shape, setup(method="full", precision="amp-bf16", zero=z, gpus=4, seq_len=8))
                           for z in (1, 2, 3))
        assert z1.peak_bytes > z2.peak_bytes
        # ZeRO-3 saves memory where the partitioned weights outweigh what it gathers: at 7B, not at 0.5B.
        assert (z2.peak_bytes > z3_peak.peak_bytes) == (shape is Q7)


def test_offload_and_8bit_adam_take_optimizer_states_off_the_gpu():
    full = dict(method="full", precision="amp-bf16", seq_len=8)
    assert estimate(Q05, setup(**full, zero=2, offload="optimizer")).breakdown.get("optimizer_states", 0) == 0
    assert estimate(Q05, setup(**full, zero=3, offload="all")).peak_bytes < \
        estimate(Q05, setup(**full, zero=3)).peak_bytes
    adam8 = estimate(Q05, setup(**full, optim="adamw-8bit")).breakdown["optimizer_states"]
    assert adam8 < 0.5 * estimate(Q05, setup(**full)).breakdown["optimizer_states"]


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b", "llama2-7b", "tiny"])
@pytest.mark.parametrize("stage", ["pt", "sft", "rm", "dpo"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_peak_is_monotone_in_every_knob(model, stage, method):
    shape = load_shape(model)
    s = setup(stage=stage, method=method, precision="amp-bf16" if method == "full" else "bf16", micro_batch=2,
              seq_len=512, ckpt_fraction=0.5)
    est = estimate(shape, s)
    peak = est.peak_bytes

    def grows(other: TrainSetup) -> None:
        # Strictly while activations set the peak; a 7B full fine-tune's peak is its optimizer step,
        # which no activation knob moves.
        bigger = estimate(shape, other).peak_bytes
        assert bigger > peak if est.moment == "backward start" else bigger >= peak

    grows(replace(s, micro_batch=4))
    grows(replace(s, seq_len=1024))
    grows(replace(s, ckpt_fraction=0.0))
    # Full checkpointing beats none; against half it can lose on a 2-layer model (it also keeps the last
    # layer's input, and rebuilds it), so only that comparison is asserted.
    none, full = (estimate(shape, replace(s, ckpt_fraction=f)).peak_bytes for f in (0.0, 1.0))
    assert full < none if est.moment == "backward start" else full <= none
    if method != "full":
        grows(replace(s, lora_rank=64))
    if stage == "pt":
        assert estimate(shape, replace(s, fused_ce=True)).peak_bytes <= peak


def test_the_152k_vocabulary_logits_dominate_unfused_pretraining():
    s = setup(stage="pt", method="full", precision="amp-bf16", micro_batch=4, seq_len=1024, ckpt_fraction=0.0)
    unfused = estimate(Q05, s).breakdown["loss"]
    assert unfused > 4 * 4 * 1024 * Q05.vocab  # more than the fp32 logits alone
    # Fused: a few hidden-size buffers per token and the head's fp32 grad, an order of magnitude less.
    assert estimate(Q05, replace(s, fused_ce=True)).breakdown["loss"] < unfused / 10


def test_dpo_reference_and_reward_head():
    full = setup(stage="dpo", method="full", precision="amp-bf16", seq_len=512)
    assert estimate(Q05, full).breakdown["reference_model"] == 4 * Q05.params
    assert "reference_model" not in estimate(Q05, replace(full, dpo_reference="precomputed")).breakdown
    assert "reference_model" not in estimate(Q05, replace(full, method="lora", precision="bf16")).breakdown
    rm = estimate(Q7, setup(stage="rm")).breakdown
    assert rm["loss"] == 0
    # The untied 7B loses its LM head (152k x 3584) for a 1-wide score head.
    assert rm["weights"] == pytest.approx(estimate(Q7, setup()).breakdown["weights"]
                                          - 2 * Q7.head_params + 2 * Q7.hidden + 4 * Q7.hidden)


def test_invalid_setups_are_named():
    with pytest.raises(SetupError, match="needs ZeRO"):
        estimate(Q05, setup(offload="optimizer"))
    with pytest.raises(SetupError, match="ZeRO-3"):
        estimate(Q05, setup(method="qlora", zero=3))
    with pytest.raises(SetupError, match="stage"):
        estimate(Q05, setup(stage="ppo"))


def test_measured_peaks_of_packed_rows_and_compiled_reward_models_are_not_under_predicted():
    """The two H200 measurements of issue 15's length-planned benchmark (bench/results/
    real_length_throughput_1.5b_h200_length_planned*.json) against the estimate of the plan that ran them: the
    packed rows' block-diagonal mask is counted, and compiled reward-model layers are credited, within 10 %."""
    q15 = PRESETS["qwen2.5-1.5b"]
    sft = setup(micro_batch=3, seq_len=2048, ckpt_fraction=0.0, fused_ce=True, fused_kernels=True, compiled=True,
                packed=True, grad_accum=2)
    rm = setup(stage="rm", micro_batch=16, seq_len=1024, ckpt_fraction=0.857, compiled=True)
    for s, measured in ((sft, 21.704), (rm, 17.99)):
        predicted = estimate(q15, s).peak_gib
        assert measured <= predicted <= measured * 1.10, (s.stage, predicted)
    assert estimate(q15, replace(sft, packed=False)).peak_gib < 21.704 - 0.5  # what the mask term adds
    assert estimate(q15, replace(rm, compiled=False)).peak_gib > 17.99 * 1.10  # what the compile credit takes


def test_this_sessions_h200_peaks_are_not_under_predicted():
    """Issue 15's closing runs (bench/results/real_length_throughput_7b_h200_sft.json and
    real_length_throughput_1.5b_h200_rm_dpo.json): 7B packed LoRA SFT and 1.5B DPO with the plans that ran,
    predicted at or above the measured peak and within 10 %."""
    sft_7b = setup(micro_batch=6, seq_len=2048, ckpt_fraction=0.964, fused_ce=True, fused_kernels=True,
                   compiled=True, packed=True, grad_accum=1)
    dpo = setup(stage="dpo", micro_batch=16, seq_len=1024, ckpt_fraction=0.857, fused_ce=True, fused_kernels=True,
                compiled=True)
    for shape, s, measured in ((PRESETS["qwen2.5-7b"], sft_7b, 21.377), (PRESETS["qwen2.5-1.5b"], dpo, 17.991)):
        predicted = estimate(shape, s).peak_gib
        assert measured <= predicted <= measured * 1.10, (s.stage, predicted)


def test_kto_h200_run_is_predicted_within_10_percent():
    """Issue 17's calibration (bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json): the plan that
    ran on the H200 under the 24 GiB cap, its peak at or above the measured one and within 10 %, tokens/s within 10 %
    of the measured median. The same file's orpo and simpo rows measured TRL's trainers on the full logits, which the
    stages no longer run (trainer_kit/fused_preference.py: the chunked head); their chunked runs are still to be
    measured (issue 49 item 6). What the chunked head leaves out is the loss over the logits: at least the bytes the
    full-logit runs measured beyond the plan's layers."""
    from medgpt_ray.memory.throughput import spec_for, tokens_per_second

    q15, h200 = PRESETS["qwen2.5-1.5b"], spec_for("NVIDIA H200")
    kto = setup(stage="kto", micro_batch=16, ckpt_fraction=0.643, fused_ce=True, fused_kernels=True, compiled=True,
                kl_batch=True)
    predicted = estimate(q15, kto).peak_gib
    assert 18.881 <= predicted <= 18.881 * 1.10, predicted
    assert tokens_per_second(q15, kto, h200) == pytest.approx(9553, rel=0.10)
    orpo = setup(stage="orpo", micro_batch=4, ckpt_fraction=0.857, fused_kernels=True, grad_accum=4)
    logits_gib = 2 * 4 * 1024 * q15.vocab * 6.8 / 2**30  # SimPO's measured ~6.8 B a logit, the smaller of the two
    assert estimate(q15, orpo).peak_gib < 15.404 - 0.9 * logits_gib


def test_full_fine_tuning_kto_on_05b_h200_run_is_predicted():
    """Issue 17's second configuration (bench/results/real_length_throughput_0.5b_h200_full_orpo_simpo_kto.json,
    Qwen2.5-0.5B, full, amp-bf16, 24 GiB cap): kto died at 23.69 GiB allocated where 21.93 was predicted (its step 1
    peaked at 20.23 before Adam's states, 3.68 GiB, existed), so the full-KTO estimate must now cover ~23.91. The
    file's orpo and simpo rows measured the full-logit trainers the stages no longer run (see above)."""
    q05 = PRESETS["qwen2.5-0.5b"]
    base = dict(method="full", precision="amp-bf16", fused_kernels=True)
    kto = setup(stage="kto", micro_batch=16, ckpt_fraction=0.25, fused_ce=True, compiled=True, kl_batch=True, **base)
    measured = 20.231 + 8 * q05.params / 2**30
    predicted = estimate(q05, kto).peak_gib
    assert measured <= predicted <= measured * 1.10, predicted
