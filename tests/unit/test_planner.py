"""The planner: fastest configuration that fits, explicit values checked, clear refusals, OOM back-off rules."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from medgpt_ray.cli import main
from medgpt_ray.config import ConfigError, LoraConfig, StageConfig, load_config
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.planner import PlanError, plan_stage
from medgpt_ray.memory.shapes import PRESETS
from medgpt_ray.memory.stage_plan import halve_micro_batch, keep_backoffs, packed_rows
from medgpt_ray.run.backoff import is_cuda_oom

Q7 = PRESETS["qwen2.5-7b"]
RTX4090 = make_budget(24, 2, "rtx4090", True, "test")


def sft_7b(**kw) -> StageConfig:
    return StageConfig(**{"method": "lora", "lora": LoraConfig(rank=8), "seq_len": 2048, "effective_batch": 32, **kw})


def test_chosen_configuration_fits_and_keeps_the_effective_batch():
    plan = plan_stage("sft", sft_7b(), 4, True, Q7, RTX4090)
    assert plan.prediction.peak_gib <= 22.0
    assert plan.micro_batch * plan.grad_accum * plan.num_workers == 32
    # Something faster was considered and rejected for memory, with the numbers.
    rejected = [a for a in plan.alternatives if "budget" in a["why"]]
    assert rejected and all(a["peak_gib"] > 22.0 and a["relative_speed"] > 1 for a in rejected)
    # LoRA's frozen base fits each 4090 whole: no ZeRO, and then no DeepSpeed config at all.
    assert (plan.zero_stage, plan.offload, plan.deepspeed) == (0, "none", None)
    sharded = plan_stage("sft", sft_7b(zero_stage=3, offload="none"), 4, True, Q7, RTX4090)
    assert sharded.deepspeed is not None
    assert sharded.deepspeed["train_micro_batch_size_per_gpu"] == sharded.micro_batch
    assert sharded.deepspeed["gradient_accumulation_steps"] == sharded.grad_accum


def test_more_memory_buys_a_faster_plan():
    small = plan_stage("sft", sft_7b(), 1, True, Q7, make_budget(24, 2, "h200", True, "test"))
    big = plan_stage("sft", sft_7b(), 1, True, Q7, make_budget(80, 2, "h200", True, "test"))
    assert big.prediction.tokens_per_s_per_gpu > small.prediction.tokens_per_s_per_gpu
    assert big.ckpt_fraction < small.ckpt_fraction or big.micro_batch > small.micro_batch


def test_explicit_values_win_and_are_checked():
    plan = plan_stage("sft", sft_7b(micro_batch=2, grad_ckpt=True), 4, True, Q7, RTX4090)
    assert (plan.micro_batch, plan.grad_accum, plan.ckpt_fraction) == (2, 4, 1.0)
    with pytest.raises(PlanError) as e:
        plan_stage("sft", sft_7b(micro_batch=8, grad_ckpt=False), 4, True, Q7, RTX4090)
    msg = str(e.value)
    assert "stages.sft: nothing fits 22.0 GiB" in msg and "micro_batch=8" in msg and "grad_ckpt=False" in msg
    assert "smallest predicted peak" in msg


def test_nothing_fits_says_what_would():
    # 7B full fine-tuning fits one 24 GiB card only with ZeRO's CPU offload, which the planner finds...
    offloaded = plan_stage("sft", sft_7b(method="full"), 1, True, Q7, RTX4090)
    assert offloaded.zero_stage >= 2 and offloaded.offload != "none"
    # ...and when ZeRO is ruled out, the refusal says what would fit instead.
    with pytest.raises(PlanError) as e:
        plan_stage("sft", sft_7b(method="full", zero_stage=0), 1, True, Q7, RTX4090)
    msg = str(e.value)
    assert "other options" in msg and "method qlora" in msg and "offload" in msg and "(fits)" in msg


def test_auto_method_may_choose_qlora_on_a_small_card():
    plan = plan_stage("sft", sft_7b(method="auto"), 1, True, Q7, make_budget(12, 1, "rtx4090", True, "test"))
    assert plan.method == "qlora" and plan.prediction.peak_gib <= 11.0


def test_cpu_without_budget_plans_for_speed_and_refuses_gpu_only_knobs():
    plan = plan_stage("sft", StageConfig(method="lora", seq_len=256, effective_batch=8), 2, False)
    assert (plan.precision, plan.ckpt_fraction, plan.micro_batch, plan.grad_accum) == ("fp32", 0.0, 4, 1)
    with pytest.raises(Exception, match="needs GPUs"):
        plan_stage("sft", StageConfig(method="qlora", effective_batch=8), 1, False)
    with pytest.raises(Exception, match="fused_ce: false is not available"):
        plan_stage("sft", StageConfig(fused_ce=False, effective_batch=8), 1, False)


def test_a_tiny_budget_forces_smaller_micro_batches_and_checkpointing():
    from medgpt_ray.memory.shapes import load_shape

    cfg = StageConfig(method="lora", seq_len=384, effective_batch=8)
    roomy = plan_stage("sft", cfg, 1, False, load_shape("tiny"), make_budget(10, 0, "auto", False, "test"))
    tight = plan_stage("sft", cfg, 1, False, load_shape("tiny"), make_budget(0.27, 0, "auto", False, "test"))
    assert roomy.micro_batch == 8 and roomy.ckpt_fraction == 0.0
    assert tight.micro_batch < 8 and tight.prediction.peak_gib <= 0.27


def test_halving_keeps_the_effective_batch_until_nothing_is_left():
    plan = plan_stage("sft", sft_7b(micro_batch=8, grad_ckpt=0.5), 1, True, Q7, make_budget(200, 2, "h200", True, "t"))
    seen = []
    first = plan
    while (smaller := halve_micro_batch(plan, sft_7b(), "CUDA out of memory", step=3)) is not None:
        plan = smaller
        seen.append((plan.micro_batch, plan.grad_accum, plan.ckpt_fraction))
    assert (first.micro_batch, first.backoffs) == (8, [])  # the back-off returns new plans; the first is unchanged
    assert seen == [(4, 8, 0.5), (2, 16, 0.5), (1, 32, 0.5), (1, 32, 1.0)]
    assert len(plan.backoffs) == 4 and plan.backoffs[0]["before"]["micro_batch"] == 8
    odd = plan_stage("sft", sft_7b(effective_batch=3, micro_batch=3), 1, True, Q7,
                     make_budget(200, 2, "h200", True, "t"))
    odd = halve_micro_batch(odd, sft_7b(effective_batch=3), "oom", 0)
    assert odd is not None and (odd.micro_batch, odd.grad_accum) == (1, 3)


def test_resumed_attempt_keeps_its_backoffs_and_fingerprint_identity_ignores_memory_knobs():
    budget = make_budget(200, 2, "h200", True, "t")
    planned = plan_stage("sft", sft_7b(micro_batch=8), 1, True, Q7, budget)
    previous = plan_stage("sft", sft_7b(micro_batch=8), 1, True, Q7, budget)
    previous = halve_micro_batch(previous, sft_7b(), "oom", 5)
    assert previous.identity() == planned.identity()
    planned = keep_backoffs(planned, previous, sft_7b())
    assert (planned.micro_batch, planned.grad_accum, len(planned.backoffs)) == (4, 8, 1)


def test_a_packed_step_is_its_rows_in_micro_batches_of_at_most_the_planned_size():
    """SFT packing (stages/packing.py) sizes a step in packed rows of seq_len; the micro-batch is the largest
    divisor of it up to the planned one (the estimate's sequences), also after an OOM back-off halved that."""
    budget = make_budget(200, 2, "h200", True, "t")
    plan = plan_stage("sft", sft_7b(micro_batch=4, zero_stage=2), 2, True, Q7, budget)
    for rows, layout in ((1, (1, 1)), (3, (3, 1)), (6, (3, 2)), (8, (4, 2)), (7, (1, 7))):
        packed = packed_rows(plan, sft_7b(), rows, 3.0)
        assert (packed.micro_batch, packed.grad_accum) == layout
        assert packed.identity() == plan.identity() and packed.packing["rows_per_step"] == rows
        ds = packed.deepspeed
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == layout
        assert ds["train_batch_size"] == rows * 2
    backed_off = halve_micro_batch(plan, sft_7b(), "oom", 3)
    again = packed_rows(backed_off, sft_7b(), 8, 3.0)
    assert (again.micro_batch, again.grad_accum) == (2, 4)


def test_oom_is_recognised_through_ray_train_wrappers():
    from ray.train import WorkerGroupError

    wrapped = WorkerGroupError("rank 1 failed", {1: torch.OutOfMemoryError("CUDA out of memory. Tried to ...")})
    assert is_cuda_oom(wrapped)
    assert not is_cuda_oom(WorkerGroupError("rank 0 failed", {0: ValueError("bad record")}))
    try:
        try:
            raise torch.OutOfMemoryError("x")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("stage failed") from inner
    except RuntimeError as outer:
        assert is_cuda_oom(outer)


ESTIMATE = ["estimate", "--model", "qwen2.5-7b", "--stage", "sft", "--method", "lora", "--precision", "bf16",
            "--micro-batch", "2", "--seq-len", "2048", "--grad-ckpt", "--fused-ce"]


def _json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_cli_every_flag(capsys, tmp_path):
    base = _json(capsys, ESTIMATE)
    assert set(base) >= {"peak_gib", "breakdown"} and base["breakdown"]["weights"] > 14
    assert _json(capsys, ESTIMATE + ["--ckpt-layers", "0.5"])["peak_gib"] > base["peak_gib"]
    assert _json(capsys, [*ESTIMATE[:-2], "--no-grad-ckpt", "--fused-ce"])["peak_gib"] > base["peak_gib"]
    assert _json(capsys, ESTIMATE + ["--lora-rank", "64"])["peak_gib"] > base["peak_gib"]
    q = _json(capsys, [a if a != "lora" else "qlora" for a in ESTIMATE])
    assert q["peak_gib"] < base["peak_gib"] - 8
    full = [a if a not in ("lora", "bf16") else {"lora": "full", "bf16": "amp-bf16"}[a] for a in ESTIMATE]
    z0 = _json(capsys, full)["peak_gib"]
    z3 = _json(capsys, full + ["--zero", "3", "--gpus", "8"])["peak_gib"]
    off = _json(capsys, full + ["--zero", "3", "--offload", "all"])["peak_gib"]
    adam8 = _json(capsys, full + ["--optim", "adamw-8bit"])["peak_gib"]
    assert z3 < z0 and off < z0 and adam8 < z0
    assert _json(capsys, full + ["--zero", "2", "--offload", "optimizer"])["breakdown"].get("optimizer_states", 0) == 0
    pt = [*ESTIMATE[:4], "pt", *ESTIMATE[5:-1]]
    assert _json(capsys, pt + ["--no-fused-ce"])["peak_gib"] > _json(capsys, pt + ["--fused-ce"])["peak_gib"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 151936,
                                                      "hidden_size": 896, "num_hidden_layers": 24,
                                                      "num_attention_heads": 14, "num_key_value_heads": 2,
                                                      "intermediate_size": 4864, "tie_word_embeddings": True}))
    from_dir = _json(capsys, [*ESTIMATE[:2], str(tmp_path), *ESTIMATE[3:]])
    assert from_dir["peak_gib"] == _json(capsys, [*ESTIMATE[:2], "qwen2.5-0.5b", *ESTIMATE[3:]])["peak_gib"]
    assert main(ESTIMATE) == 0 and "predicted peak allocated" in capsys.readouterr().out


def test_estimate_says_where_a_kinds_own_keys_are_left_out(capsys):
    """`estimate` takes no config: a kind whose own keys add memory (opd's teacher, grpo's generation) is estimated
    without them, and says so, pointing at `plan`; sft's estimate is whole and has no note."""
    assert main(ESTIMATE) == 0
    assert "note:" not in capsys.readouterr().out
    opd = [*ESTIMATE[:4], "opd", *ESTIMATE[5:]]
    assert main(opd) == 0
    out = capsys.readouterr().out
    assert "note: opd's own keys are not read here" in out and "medgpt-ray plan --config FILE" in out
    grpo = [*ESTIMATE[:4], "grpo", *ESTIMATE[5:]]
    assert main(grpo) == 0 and "note: grpo's own keys" in capsys.readouterr().out
    assert "teacher_weights" not in out


def test_estimate_cli_errors_name_the_problem(capsys, tmp_path):
    assert main([*ESTIMATE[:2], str(tmp_path / "nope"), *ESTIMATE[3:]]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert main(ESTIMATE + ["--offload", "optimizer"]) == 2
    assert "needs ZeRO" in capsys.readouterr().err


def test_estimate_is_a_console_command():
    out = subprocess.run([sys.executable, "-m", "medgpt_ray.cli", *ESTIMATE, "--json"], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out)["peak_gib"] > 14


def test_plan_cli_on_the_shipped_4090_config(capsys, repo):
    cfg = str(repo / "configs/qwen2.5-7b-4x4090.yaml")
    assert main(["plan", "--config", cfg]) == 0
    out = capsys.readouterr().out
    for stage in ("pt", "sft", "rm", "dpo"):
        assert f"stage {stage}: qwen2.5-7b on 4 worker(s), budget 22.0 GiB" in out
    assert "chosen" in out and "rejected" in out
    assert main(["plan", "--config", cfg, "--gpu-mem-gib", "5"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits 3.00 GiB" in out and "method qlora" in out
    assert main(["plan", "--config", cfg, "--json", "--margin-gib", "1"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans["sft"]["prediction"]["budget_gib"] == 23.0


def test_planning_a_config_whose_model_is_elsewhere_needs_a_shape(tmp_path, repo):
    from medgpt_ray.config import ConfigError
    from medgpt_ray.memory.planner import plan_all

    cfg = load_config(repo / "configs/qwen2.5-7b-4x4090.yaml", ["model.shape=null"])
    with pytest.raises(ConfigError, match="set model.shape"):
        plan_all(cfg, default_gpu_gib=24)


def test_compiled_layers_where_measured_and_only_there():
    sft = plan_stage("sft", sft_7b(), 1, True, Q7, RTX4090)
    # No liger-kernel here: the fused layer ops the estimate assumes can only come from compiling.
    assert sft.compile and sft.fused_kernels
    assert not plan_stage("sft", sft_7b(method="qlora"), 1, True, Q7, RTX4090).compile
    assert not plan_stage("sft", sft_7b(zero_stage=3), 4, True, Q7, RTX4090).compile
    assert not plan_stage("sft", sft_7b(), 1, False).compile  # CPU: auto stays eager
    assert not plan_stage("sft", sft_7b(max_steps=10), 1, True, Q7, RTX4090).compile  # compiling would not pay
    eager = plan_stage("sft", sft_7b(compile=False), 1, True, Q7, RTX4090)
    assert not eager.compile and not eager.fused_kernels  # nothing would fuse them
    assert eager.prediction.peak_gib >= sft.prediction.peak_gib
    assert plan_stage("sft", sft_7b(compile=True), 1, False).compile  # explicit: also on CPU
    with pytest.raises(ConfigError, match=r"stages\.sft\.fused_kernels"):
        plan_stage("sft", sft_7b(compile=False, fused_kernels=True), 1, True, Q7, RTX4090)


def test_cpu_offload_must_fit_the_nodes_host_ram():
    """7B full fine-tuning on 24 GiB cards needs CPU offload: 16 bytes per parameter of host RAM per rank."""
    full = StageConfig(method="full", seq_len=2048, effective_batch=32)
    roomy = make_budget(24, 2, "rtx4090", True, "test", host_gib=512, gpus_per_node=4)
    plan = plan_stage("sft", full, 4, True, Q7, roomy)
    assert plan.offload == "optimizer"
    # optimizer offload: fp32 master + two moments + fp32 grads = 16 bytes per parameter over 4 ranks x 4 ranks
    assert plan.prediction.host_offload_gib_per_node == pytest.approx(16 * Q7.params / 2**30, abs=0.01)
    tight = make_budget(24, 2, "rtx4090", True, "test", host_gib=64, gpus_per_node=4)
    with pytest.raises(PlanError, match=r"host RAM per node .*> 51\.2 GiB usable"):
        plan_stage("sft", full, 4, True, Q7, tight)
    # Two nodes of two GPUs: each node holds half the ranks, so half the RAM is enough.
    two_nodes = make_budget(24, 2, "rtx4090", True, "test", host_gib=128, gpus_per_node=2)
    assert plan_stage("sft", full, 4, True, Q7, two_nodes).prediction.host_offload_gib_per_node <= 0.8 * 128


def test_host_ram_comes_from_the_config_or_the_gpu_node(tmp_path, repo):
    from medgpt_ray.memory.budget import GPUMemory, read_host_available_gib
    from medgpt_ray.memory.planner import resolve_budget

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263842948 kB\nMemAvailable:   201326592 kB\n")
    assert read_host_available_gib(str(meminfo)) == 192.0
    assert read_host_available_gib(str(tmp_path / "absent")) is None
    cfg = load_config(repo / "configs/qwen2.5-7b-4x4090.yaml")
    node = GPUMemory("NVIDIA GeForce RTX 4090", 23.99, 23.5, host_available_gib=120.0, gpus_on_node=4)
    b = resolve_budget(cfg.model_copy(update={"resources": cfg.resources.model_copy(
        update={"gpu_memory_gib": None})}), lambda: node, None)
    assert (b.host_gib, b.gpus_per_node) == (120.0, 4)
    r = cfg.resources.model_copy(update={"gpu_memory_gib": 24.0, "host_memory_gib": 256.0, "gpus_per_node": 8})
    b = resolve_budget(cfg.model_copy(update={"resources": r}), lambda: node, None)
    assert (b.host_gib, b.gpus_per_node) == (256.0, 8) and "host RAM for offload 204.8 GiB" in b.describe()


@pytest.mark.parametrize("kw", [{}, {"micro_batch": 2, "grad_ckpt": 0.5}, {"method": "full", "zero_stage": 3}])
def test_plan_train_setup_is_the_setup_the_planner_scored(kw):
    from medgpt_ray.memory.estimator import estimate
    from medgpt_ray.memory.throughput import GPU_SPECS, tokens_per_second

    cfg = sft_7b(**kw)
    plan = plan_stage("sft", cfg, 4, True, Q7, make_budget(80, 2, "h200", True, "t"))
    setup = plan.train_setup(cfg)
    assert (setup.micro_batch, setup.grad_accum, setup.zero, setup.gpus) == (
        plan.micro_batch, plan.grad_accum, plan.zero_stage, 4)
    assert round(estimate(Q7, setup).peak_gib, 3) == plan.prediction.peak_gib
    assert round(tokens_per_second(Q7, setup, GPU_SPECS["h200"]), 1) == plan.prediction.tokens_per_s_per_gpu
    assert plan.examples_per_step == cfg.effective_batch


def test_plan_json_round_trips_with_typed_placement_and_prediction():
    from medgpt_ray.placement.policy import place_stage
    from medgpt_ray.placement.topology import load_topology_file

    plan = plan_stage("sft", sft_7b(), 4, True, Q7, RTX4090)
    plan = replace(plan, placement=place_stage(load_topology_file("8x4090-dual-socket"), 4, None, {}))
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["placement"]["gpus"] == plan.placement.gpus and d["prediction"]["peak_gib"] == plan.prediction.peak_gib
    back = type(plan).from_dict(d)
    assert back.placement == plan.placement and back.prediction == plan.prediction and back == plan


def test_reference_free_methods_are_planned_on_the_chunked_head_and_no_reference():
    """orpo and simpo (memory kind "orpo"): chosen and rejected in one forward like DPO, no reference pass, and the
    loss on TRL's chunked LM head (trainer_kit/fused_preference.py): DPO's loss memory, not the full logits'."""
    from medgpt_ray.config import DPOStageConfig, ORPOStageConfig, SimPOStageConfig
    from medgpt_ray.memory.estimator import TrainSetup, estimate

    budget = make_budget(24, 2, "rtx4090", True, "t")
    kw = dict(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, effective_batch=16)
    for cls in (ORPOStageConfig, SimPOStageConfig):
        stage = "orpo" if cls is ORPOStageConfig else "simpo"
        plan = plan_stage(stage, cls(**kw), 1, True, Q7, budget)
        assert plan.fused_ce and plan.prediction.peak_gib <= 22.0
        assert plan.prediction.breakdown_gib["loss"] < 1.0  # no 2 x micro-batch x 1024 tokens x 152k logits
        assert plan.train_setup(cls(**kw)).stage == "orpo" and plan.compile  # bucketed lengths: compiled on auto
        assert not plan_stage(stage, cls(**kw, max_steps=16), 1, True, Q7, budget).compile  # below 50 steps
        with pytest.raises(ConfigError, match=f"stages.{stage}.fused_ce: false is not available"):
            plan_stage(stage, cls(**kw, fused_ce=False), 1, True, Q7, budget)
    dpo = dict(stage="dpo", method="lora", precision="bf16", micro_batch=2, seq_len=1024, ckpt_fraction=1.0,
               fused_ce=True)
    assert estimate(Q7, TrainSetup(**{**dpo, "stage": "orpo"})).breakdown_gib()["loss"] == \
        estimate(Q7, TrainSetup(**dpo)).breakdown_gib()["loss"]
    assert plan_stage("dpo", DPOStageConfig(**kw), 1, True, Q7, budget).fused_ce
