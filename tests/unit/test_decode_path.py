"""The decode path (generation/decode_path.py) each generating stage gets, and what the plan prices for it
(memory/generation.py): the static path's KV cache at full length and the CUDA-graph pool of its compiled step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from medgpt_ray.config import GRPOStageConfig, LoraConfig
from medgpt_ray.generation.decode_path import choose
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import TrainSetup
from medgpt_ray.memory.format import plan_line
from medgpt_ray.memory.generation import cuda_graph_pool_bytes, decode_path, expanded_kv_bytes, kv_cache_bytes
from medgpt_ray.memory.generation import peak as estimate
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import PRESETS

Q7 = PRESETS["qwen2.5-7b"]
GPU = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=8, grad_accum=8, seq_len=1024,
                 fused_ce=True, generations=8, completion_len=512, generation_on_gpu=True)


@pytest.mark.parametrize(("requested", "kw", "name", "compiled", "reason"), [
    ("auto", dict(cuda=True), "static", True, "CUDA graphs"),
    ("auto", dict(cuda=False), "dynamic", False, "CPU"),
    ("auto", dict(cuda=True, hybrid=True), "static", True, "linear-attention layers' state held in the static"),
    ("auto", dict(cuda=False, hybrid=True), "dynamic", False, "CPU"),
    ("auto", dict(cuda=True, quantized=True), "dynamic", False, "QLoRA"),
    ("auto", dict(cuda=True, zero3=True), "dynamic", False, "ZeRO-3"),
    ("dynamic", dict(cuda=True), "dynamic", False, "generation_path: dynamic"),
    ("static", dict(cuda=False), "static", False, "no compilation on the CPU"),
    ("static", dict(cuda=True, quantized=True), "static", False, "bitsandbytes"),
    ("static", dict(cuda=True, zero3=True), "dynamic", False, "refused: ZeRO-3"),
])
def test_the_decode_path_and_why(requested, kw, name, compiled, reason):
    path = choose(requested, **kw)
    assert (path.name, path.compiled) == (name, compiled) and reason in path.reason


def test_an_unknown_request_is_refused():
    with pytest.raises(ValueError, match="generation_path 'fast': one of auto, dynamic, static"):
        choose("fast", cuda=True)


def test_the_cuda_graph_pool_of_the_compiled_decode_step():
    # 64 completions a call, bf16: one layer's activations for one token each, fp32 scores over 1024 positions in
    # 28 heads, the mask and the logits, doubled; and K and V repeated from 4 KV heads to the 28 over 1024 positions.
    layer = 2 * 64 * (4 * 3584 + 3584 + 2 * 512 + 3 * 18944)
    scores = 2 * 4 * 64 * 28 * 1024
    repeated = 2 * 64 * 28 * 128 * 1024 * 2
    assert expanded_kv_bytes(Q7, GPU) == repeated
    assert cuda_graph_pool_bytes(Q7, GPU) == 2 * (layer + scores + 4 * 64 * 1024 + 2 * 64 * 152064) + repeated
    assert cuda_graph_pool_bytes(Q7, GPU) / 2**20 == pytest.approx(84.1 + 896, abs=0.1)
    # A model whose every query head has its own KV head repeats nothing.
    assert expanded_kv_bytes(replace(Q7, kv_heads=Q7.heads), GPU) == 0
    for dynamic in (replace(GPU, generation_on_gpu=False), replace(GPU, generation_path="dynamic"),
                    replace(GPU, method="qlora"), replace(GPU, generations=0)):
        assert cuda_graph_pool_bytes(Q7, dynamic) == 0


def test_the_static_path_peaks_above_the_dynamic_one_by_its_pool_and_keeps_both_for_training():
    static, dynamic = estimate(Q7, GPU), estimate(Q7, replace(GPU, generation_path="dynamic"))
    assert dynamic.moment == "generation"
    # The KV cache is priced at its full length for the whole call on both paths: a static cache's size.
    assert static.breakdown["kv_cache"] == dynamic.breakdown["kv_cache"] == kv_cache_bytes(Q7, GPU)
    assert static.breakdown["cuda_graph_pool"] == cuda_graph_pool_bytes(Q7, GPU) > 0
    # The eager steps' repeated K/V is the dynamic path's own term; the compiled step's is in its pool.
    assert dynamic.breakdown["decode_expanded_kv"] == expanded_kv_bytes(Q7, GPU) > 0
    assert "decode_expanded_kv" not in static.breakdown
    assert static.peak_bytes >= dynamic.peak_bytes + cuda_graph_pool_bytes(Q7, GPU) - expanded_kv_bytes(Q7, GPU)
    # The static cache and the graphs' pool outlive the rollout: the training pass holds them too.
    one_call = replace(GPU, gen_steps=1)  # a generate call of one micro-batch: training peaks
    static, dynamic = estimate(Q7, one_call), estimate(Q7, replace(one_call, generation_path="dynamic"))
    assert static.moment.startswith("training") and dynamic.moment.startswith("training")
    held = kv_cache_bytes(Q7, one_call) + cuda_graph_pool_bytes(Q7, one_call)
    assert static.peak_bytes - dynamic.peak_bytes == pytest.approx(held) and held > 0


def test_the_plan_names_the_path_and_why():
    kw = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, max_completion_length=512,
              effective_batch=32, num_generations=8, grad_ckpt=True)
    budget = make_budget(48.0, 2.0, "t", True, "t")
    plan = plan_stage("grpo", GRPOStageConfig(**kw), 1, True, Q7, budget)
    assert plan.generation_path == "static" and "decode: static (auto: static cache" in plan.rollout
    assert cuda_graph_pool_bytes(Q7, plan.train_setup(GRPOStageConfig(**kw))) > 0  # priced in its generation phase
    assert "rollouts: merged LoRA" in plan_line(plan) and "decode: static" in plan_line(plan)  # the progress line
    forced = plan_stage("grpo", GRPOStageConfig(**kw, generation_path="dynamic"), 1, True, Q7, budget)
    assert forced.generation_path == "dynamic" and "decode: dynamic (generation_path: dynamic)" in forced.rollout
    cpu = plan_stage("grpo", GRPOStageConfig(**{**kw, "precision": "fp32"}), 1, False, Q7, budget)
    assert cpu.generation_path == "dynamic"
    hybrid = replace(Q7, linear_layers=tuple(range(0, 28, 4)))
    assert decode_path(hybrid, GPU).name == "static"  # a hybrid decodes on the static path too (measured on an H100)
    assert "linear-attention layers' state" in decode_path(hybrid, GPU).reason


@pytest.mark.parametrize(("change", "breaks"), [
    ({}, True),  # Liger's layer kernels in a stage decoding on the compiled static path
    ({"compiled": True}, False),  # fused by compiling the layers instead: no Liger
    ({"fused_kernels": False}, False),
    ({"generation_path": "dynamic"}, False),
    ({"generation_on_gpu": False}, False),  # nothing compiled on the CPU
    ({"method": "qlora"}, False),  # a 4-bit base decodes dynamically
    ({"generations": 0, "stage": "sft"}, False),  # a stage that does not generate
])
def test_liger_layers_are_no_candidate_beside_a_compiled_decode_step(change, breaks):
    """H200, 1.5B grpo: Liger's torch.compiler.disable'd RoPE broke the compiled decode step at every layer (16
    graphs, CUDA graphs skipped, 373 generated tokens/s against 2,888 compiled whole)."""
    from medgpt_ray.memory.candidates import liger_breaks_decode

    s = replace(GPU, **{"fused_kernels": True, "compiled": False, **change})
    assert liger_breaks_decode(Q7, s) is breaks


def test_the_static_decode_step_is_priced_as_the_h200_measured_it(repo):
    """The throughput model's compiled static step against every merged-static row measured: the H200's in
    transformers' generate loop (bench/results/generation_*_h200.json: 1.5B and 7B at 16 and 64 sequences), the
    H100's in our own loop (generation_1.5b_h100_loop.json); the eager step is priced far slower (21.7-30.4 ms
    measured merged on the dynamic path)."""
    import json

    from medgpt_ray.memory.throughput import GPU_SPECS, decode_step_seconds, static_decode_step_seconds

    rows = 0
    for name, preset, gpu in (("generation_1.5b_h200.json", "qwen2.5-1.5b", "h200"),
                              ("generation_7b_h200.json", "qwen2.5-7b", "h200"),
                              ("generation_1.5b_h100_loop.json", "qwen2.5-1.5b", "h100")):
        result = json.loads((repo / "bench" / "results" / name).read_text())
        shape, spec = PRESETS[preset], GPU_SPECS[gpu]
        for row in result["rows"]:
            # Rows without "loop" ran in generate's loop, which is fitted on the H200 only (a host's speed varies).
            generate_loop = row.get("loop", "generate").startswith("generate")
            if not row["path"].startswith("merged-static") or (generate_loop and gpu != "h200"):
                continue
            s = TrainSetup(stage="grpo", method="lora", precision="bf16", micro_batch=row["batch"], grad_accum=1,
                           seq_len=result["prompt_len"] + result["new_tokens"], fused_ce=True,
                           generations=row["batch"], completion_len=result["new_tokens"], generation_on_gpu=True)
            # Rows without "attention" were measured before the packed-GQA decode: transformers' repeat_kv.
            repeats = row.get("attention", "sdpa") == "sdpa"
            predicted_ms = 1000 * static_decode_step_seconds(shape, s, spec, repeats, generate_loop)
            assert predicted_ms == pytest.approx(row["ms_per_decode_step"], rel=0.09), (name, row["batch"])
            if not repeats and not generate_loop:  # the product's own path is what decode_step_seconds prices
                assert decode_step_seconds(shape, s, spec) == pytest.approx(predicted_ms / 1000)
            eager_ms = 1000 * decode_step_seconds(shape, replace(s, generation_path="dynamic"), spec)
            assert eager_ms > 2 * predicted_ms
            rows += 1
    assert rows >= 6


def test_a_rollout_cache_is_as_long_as_the_plan_priced_it(tiny_model):
    """grpo's plan prices the cache at the data's planned length (prompt + completion), not the seq_len cap; opd's
    at seq_len (its prompts + max_new_tokens fit there); a dynamic plan builds none."""
    from medgpt_ray.kinds.opd.config import OPDStageConfig
    from medgpt_ray.trainer_kit.static_rollouts import static_decoding

    grpo = GRPOStageConfig(method="lora", lora=LoraConfig(rank=8), seq_len=1024, max_completion_length=256,
                           generation_path="static")
    plan = replace(plan_stage("grpo", grpo, 1, False), seq_len_planned=512)
    assert static_decoding(plan, grpo) == {"decode_max_len": 512}
    assert static_decoding(replace(plan, generation_path="dynamic"), grpo) is None
    opd = OPDStageConfig(teacher=str(tiny_model), method="lora", seq_len=1024, max_new_tokens=128,
                         generation_path="static")
    plan = replace(plan_stage("opd", opd, 1, False), seq_len_planned=256)
    assert static_decoding(plan, opd) == {"decode_max_len": 1024}
