"""Planning by the data's real lengths (issue 15 item 3): the length profile of a train split, and plans made with it.

Short medical QA padded to seq_len is what the planner assumed before; these tests check that a plan made with the
data's lengths is for the batches that really come (padded at the sampled longest row, or packed rows of seq_len),
trains the same examples per step, and says in plan.json what it used.
"""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import DPOStageConfig, LoraConfig, PipelineConfig, RMStageConfig, SFTStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.budget import make_budget
from medgpt_ray.memory.estimator import PACKED_MASK_BYTES_PER_ELEMENT, TrainSetup, estimate
from medgpt_ray.memory.lengths import PAD_MULTIPLE, LengthProfile
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.shapes import PRESETS
from medgpt_ray.memory.stage_plan import binned, halve_micro_batch
from medgpt_ray.run.planning import plan_by_lengths
from medgpt_ray.stages.length_profile import measure

Q7 = PRESETS["qwen2.5-7b"]
CARD = make_budget(24, 2, "rtx4090", True, "test")


def sft(**kw) -> SFTStageConfig:
    return SFTStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=2048, effective_batch=32,
                          **kw)


def dpo(**kw) -> DPOStageConfig:
    return DPOStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=2048, effective_batch=16,
                          **kw)


def test_the_profile_is_percentiles_of_the_sample_and_pads_to_its_longest_row():
    lengths = list(range(1, 101))  # 1..100 tokens
    whole = LengthProfile.of(lengths, records=100, seq_len=1024)
    assert (whole.p50, whole.p95, whole.p99, whole.max) == (50, 95, 99, 100)
    assert PAD_MULTIPLE == 128 and whole.whole_split and whole.padded_len() == 128  # 100 -> 128
    sampled = LengthProfile.of(lengths, records=10_000, seq_len=1024)
    assert not sampled.whole_split and sampled.padded_len() == 128  # 100 x 1.15 = 115 -> 128
    assert LengthProfile.of([120], records=2, seq_len=1024).padded_len() == 256  # unseen rows: 138 -> 256
    assert LengthProfile.of([120], records=1, seq_len=1024).padded_len() == 128
    assert LengthProfile.of([5000], records=1, seq_len=1024).padded_len() == 1024  # never above seq_len


def test_padded_batches_are_planned_at_the_data_length_and_say_so():
    """Short preference pairs (at most 300 tokens) under a 24 GiB card: the plan at their length predicts less
    memory than one at seq_len and so may run bigger micro-batches or recompute less; same pairs per step."""
    blind = plan_stage("dpo", dpo(), 1, True, Q7, CARD)
    profile = LengthProfile.of([80 + i % 220 for i in range(500)], records=500, seq_len=2048)
    seen = plan_stage("dpo", dpo(), 1, True, Q7, CARD, profile)
    assert seen.seq_len_planned == 384 and blind.seq_len_planned == 2048
    assert seen.identity() == blind.identity() and seen.examples_per_step == 16
    assert seen.train_setup(dpo()).seq_len == 384
    assert (seen.micro_batch, -seen.ckpt_fraction) > (blind.micro_batch, -blind.ckpt_fraction)
    assert seen.prediction.tokens_per_s_per_gpu > blind.prediction.tokens_per_s_per_gpu
    assert seen.lengths["max"] == 299 and any("planned at 384 tokens" in r for r in seen.reasons)
    assert any("not read" in r for r in blind.reasons)


def test_packed_sft_is_planned_in_rows_of_seq_len():
    """32 conversations per step at 8 conversations per packed row: 4 rows of 2048 tokens per step. The micro-batch
    is searched among the divisors of 4 rows, and the plan still trains 32 conversations a step."""
    blind = plan_stage("sft", sft(), 1, True, Q7, CARD)
    profile = LengthProfile.of([40] * 900 + [400] * 100, records=1000, seq_len=2048, conversations_per_row=8.0)
    packed = plan_stage("sft", sft(), 1, True, Q7, CARD, profile)
    assert packed.packing == {"rows_per_step": 4, "conversations_per_step": 32, "conversations_per_row": 8.0}
    assert packed.micro_batch * packed.grad_accum == 4 and packed.micro_batch in (1, 2, 4)
    assert packed.identity() == blind.identity() and packed.examples_per_step == 32
    assert packed.seq_len_planned == 2048
    # 7B: memory-bound either way; 1.5B: at most 6 rows of 2048 a step instead of 32 sequences of 2048, so it
    # recomputes fewer layers.
    q15 = PRESETS["qwen2.5-1.5b"]
    few_rows = LengthProfile.of([40] * 10, records=10, seq_len=2048, conversations_per_row=5.4)
    assert plan_stage("sft", sft(), 1, True, q15, CARD, few_rows).ckpt_fraction < \
        plan_stage("sft", sft(), 1, True, q15, CARD).ckpt_fraction
    # packing: false plans the same data padded, at its longest conversation
    padded = plan_stage("sft", sft(packing=False), 1, True, Q7, CARD, profile)
    assert padded.packing is None and padded.seq_len_planned == 512
    # packing: by_length is planned as the packed rows' token budget, which its worker bins by length
    by_length = plan_stage("sft", sft(packing="by_length"), 1, True, Q7, CARD, profile)
    assert by_length.packing == packed.packing and by_length.micro_batch == packed.micro_batch
    assert any("padded by length (packing: by_length) in bins of up to 2048 tokens" in r for r in by_length.reasons)
    assert sft(packing="by_length").training_identity() not in (sft().training_identity(),
                                                               sft(packing=False).training_identity())


def test_packed_rm_is_planned_in_rows_of_two_seq_lens_that_hold_whole_pairs():
    """16 pairs per step at 2 pairs per packed row: 8 rows of 2 x 1024 tokens (a row has the tokens of one pair at
    its longest, what an unpacked micro-batch of one pair is planned for; its mask is (2 x seq_len)^2)."""
    rm = RMStageConfig(method="lora", lora=LoraConfig(rank=8), precision="bf16", seq_len=1024, effective_batch=16,
                       packing=True)
    profile = LengthProfile.of([800] * 100, records=100, seq_len=1024, conversations_per_row=2.0)
    packed = plan_stage("rm", rm, 1, True, PRESETS["qwen2.5-1.5b"], CARD, profile)
    assert packed.packing == {"rows_per_step": 8, "conversations_per_step": 16, "conversations_per_row": 2.0}
    assert packed.micro_batch * packed.grad_accum == 8 and packed.examples_per_step == 16
    assert packed.seq_len_planned == 1024 and any("16 pairs per worker step in 8 rows of 2048 tokens" in r
                                                  for r in packed.reasons)
    setup = packed.train_setup(rm)
    assert setup.packed and setup.tokens() == packed.micro_batch * 2048
    mask = estimate(PRESETS["qwen2.5-1.5b"], TrainSetup("rm", "lora", "bf16", micro_batch=2, seq_len=1024,
                                                        packed=True)).breakdown["packed_attention_mask"]
    assert mask == PACKED_MASK_BYTES_PER_ELEMENT * 2 * 2048 ** 2  # every layer checkpointed: one layer's mask
    padded = plan_stage("rm", rm.model_copy(update={"packing": False}), 1, True, PRESETS["qwen2.5-1.5b"], CARD,
                        profile)
    assert padded.packing is None and padded.seq_len_planned == 896  # the longest pair side, to a bucket
    assert rm.model_copy(update={"packing": False}).training_identity() != rm.training_identity()  # fingerprinted
    by_length = plan_stage("rm", rm.model_copy(update={"packing": "by_length"}), 1, True, PRESETS["qwen2.5-1.5b"],
                           CARD, profile)  # the pair rows' token budget, binned by length on the worker
    assert by_length.packing == packed.packing and any("bins of up to 2048 tokens" in r for r in by_length.reasons)


def test_a_packed_plan_falls_back_safely_where_the_worker_cannot_pack():
    """Padded by length (memory/stage_plan.binned): bins of at most a packed row's tokens, as many a micro-batch as
    the plan had rows and the same checkpointing, so no micro-batch needs more than the plan was checked for."""
    profile = LengthProfile.of([40] * 100, records=100, seq_len=2048, conversations_per_row=16.0)
    packed = plan_stage("sft", sft(), 2, True, Q7, CARD, profile)
    plain = binned(packed, sft(), examples_per_bin=16.0)
    bins = plain.length_bins
    assert plain.packing is None and bins["bin_tokens"] == 2048 and bins["conversations_per_step"] == 16
    assert plain.micro_batch * plain.grad_accum == bins["bins_per_step"] == 1
    assert plain.micro_batch <= packed.micro_batch and plain.ckpt_fraction == packed.ckpt_fraction
    assert plain.identity() == packed.identity()
    # an OOM back-off of a packed plan halves rows, keeping the rows per step
    if packed.micro_batch > 1:
        half = halve_micro_batch(packed, sft(), "oom", 1)
        assert half.micro_batch * half.grad_accum == packed.packing["rows_per_step"]
        assert half.identity() == packed.identity()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, repo, tiny_model):
    out = tmp_path_factory.mktemp("lengths")
    return {kind: prepare_kind(kind, [str(repo / path)], out / "data", 0.1)
            for kind, path in (("sft", "data/sample/sft_sharegpt.jsonl"),
                               ("preference", "data/sample/reward.jsonl"),
                               ("prompt", "data/sample/rl/department_prompts.jsonl"))}


def test_the_profile_is_measured_as_the_stage_encodes(prepared, tiny_model):
    """The real tokenizer and template over the prepared train split: SFT lengths as encode_sft makes them (with
    their packing), preference pairs by their longer side; pt is never measured (blocks are seq_len long)."""
    from medgpt_ray import models, templates
    from medgpt_ray.data.shards import num_rows, read_records

    cfg = SFTStageConfig(seq_len=1024)
    prof = measure("sft", cfg, "chatml", tiny_model, prepared["sft"].train_file)
    assert prof.records == num_rows(prepared["sft"].train_file) and prof.whole_split
    tok, tpl = models.load_tokenizer(tiny_model), templates.get_template("chatml")
    first = read_records(prepared["sft"].train_file, 0, None)
    want = sorted(len(templates.encode_sft(tok, tpl, r["conversations"], max_len=1024)["input_ids"]) for r in first)
    assert (prof.max, prof.p50) == (want[-1], want[(len(want) + 1) // 2 - 1])
    assert prof.conversations_per_row is not None and prof.conversations_per_row > 1
    assert measure("sft", SFTStageConfig(seq_len=1024, packing=False), "chatml", tiny_model,
                   prepared["sft"].train_file).conversations_per_row is None
    pref = measure("dpo", DPOStageConfig(seq_len=256), "chatml", tiny_model, prepared["preference"].train_file)
    assert 0 < pref.p50 <= pref.max <= 256 and pref.conversations_per_row is None
    pairs = prepared["preference"].train_file
    rm = measure("rm", RMStageConfig(seq_len=256, packing=True), "chatml", tiny_model, pairs)
    assert (rm.p50, rm.max) == (pref.p50, pref.max) and rm.conversations_per_row > 1  # whole pairs a 512-token row
    for off in (RMStageConfig(seq_len=256, packing=False), RMStageConfig(seq_len=256)):  # auto: rm stays padded
        assert measure("rm", off, "chatml", tiny_model, prepared["preference"].train_file
                       ).conversations_per_row is None
    assert measure("pt", SFTStageConfig(seq_len=256), "chatml", tiny_model, prepared["sft"].train_file) is None


def test_the_pipeline_replans_the_stages_that_run_and_prints_what_it_used(prepared, tiny_model, tmp_path):
    cfg = PipelineConfig.model_validate({
        "name": "lp", "output_dir": str(tmp_path), "model": {"path": "tiny"},
        "resources": {"num_workers": 1, "gpu_memory_gib": None},
        "stages": {"pt": {"enabled": False}, "sft": {"seq_len": 256, "effective_batch": 8},
                   "rm": {"seq_len": 256, "effective_batch": 8}, "dpo": {"enabled": False}}})
    from medgpt_ray.memory.planner import plan_all

    plans, errors = plan_all(cfg)
    assert not errors
    budget = make_budget(None, 0.0, "auto", False, "test")
    lines: list[str] = []
    out = plan_by_lengths(cfg, plans, budget, tiny_model, ["sft", "rm"], prepared, lines.append)
    assert out["sft"].packing is not None and out["sft"].packing["conversations_per_step"] == 8
    assert out["rm"].seq_len_planned is not None and out["rm"].seq_len_planned <= 256
    assert out["rm"].packing is None  # rm's packing: auto leaves rm padded (lengths.packing_setting)
    assert [ln.split("]")[0] for ln in lines] == ["[sft", "[sft", "[ rm", "[ rm"]
    assert "lengths:" in lines[0] and "packed:" in lines[1]
    assert json.loads(json.dumps(out["rm"].to_dict()))["lengths"]["sampled"] == out["rm"].lengths["records"]


def test_grpo_is_measured_as_its_prompts_plus_the_completion_budget(prepared, tiny_model):
    """A prompt record has no answer to encode: each sample is its rendered prompt plus max_completion_length (what
    TRL pads a generated batch up to), never 0 (the H200 run planned grpo at 1 token before this)."""
    from medgpt_ray import models, templates
    from medgpt_ray.config import GRPOStageConfig
    from medgpt_ray.data.shards import read_records

    cfg = GRPOStageConfig(seq_len=96, max_completion_length=8)
    prof = measure("grpo", cfg, "chatml", tiny_model, prepared["prompt"].train_file)
    tok, tpl = models.load_tokenizer(tiny_model), templates.get_template("chatml")
    first = read_records(prepared["prompt"].train_file, 0, 1)[0]
    rendered = templates.render_prompt(tpl, tok, first["conversations"], tools=first.get("tools"))
    prompt = len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert 8 < prof.p50 <= prof.max <= 96 and prof.over_seq_len == 0
    assert prompt + 8 <= prof.max


def test_flex_attention_plans_packed_rows_without_the_dense_mask_and_says_so():
    """sft's `attention: flex` keeps a BlockMask instead of SDPA's [rows, L, L] mask per layer: the planner drops that
    term (so the same rows cost less, or more fit), plan.json and the plan line name the attention, and a CPU stage
    (flex has no CPU backward) is refused naming the key."""
    from medgpt_ray.config import ConfigError
    from medgpt_ray.memory.format import format_plan, plan_line

    profile = LengthProfile.of([200] * 100, records=100, seq_len=2048, conversations_per_row=8.0)
    sdpa = plan_stage("sft", sft(), 1, True, Q7, CARD, profile)
    flex = plan_stage("sft", sft(attention="flex"), 1, True, Q7, CARD, profile)
    assert sdpa.attention is None and flex.attention == "flex"
    assert "packed_attention_mask" in sdpa.prediction.breakdown_gib
    assert "packed_attention_mask" not in flex.prediction.breakdown_gib
    same_rows = [estimate(Q7, TrainSetup("sft", "lora", "bf16", micro_batch=2, seq_len=2048, packed=True,
                                         ckpt_fraction=0.0, attention=a)).peak_bytes for a in ("sdpa", "flex")]
    # the mask of every layer that keeps its activations (all 28: no checkpointing)
    assert same_rows[0] - same_rows[1] == pytest.approx(PACKED_MASK_BYTES_PER_ELEMENT * 2 * 2048**2 * 28)
    assert "flex attention" in plan_line(flex) and "flex attention" not in plan_line(sdpa)
    assert any("attention: flex (stages.sft.attention)" in r for r in format_plan(flex))
    assert flex.identity() == sdpa.identity()  # a memory knob: the same updates, the same fingerprint
    with pytest.raises(ConfigError, match=r"stages\.sft\.attention: flex trains on a GPU only"):
        plan_stage("sft", sft(attention="flex").model_copy(update={"precision": "fp32"}), 1, False, Q7, None,
                   profile)
