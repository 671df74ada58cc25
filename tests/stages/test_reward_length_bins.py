"""A packed rm plan on a worker that does not pack trains TRL's padded pairs by length (memory/stage_plan.binned,
trainer_kit/length_bins.py), not one pair a micro-batch with every layer recomputing: bins of a packed pair row's
2 x seq_len tokens, a pair costing 2 x its longer side padded, the packed plan's checkpointing, the plan the
driver writes to plan.json, and an OOM back-off that halves the bins per micro-batch over the same steps. The tiny
model, TRL's RewardTrainer, a plain process."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from medgpt_ray.config import LoraConfig, RMStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.format import plan_line
from medgpt_ray.memory.lengths import BUCKET
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.memory.stage_plan import StagePlan, halve_micro_batch, packed_rows
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.packing import WORKER_PLAN
from medgpt_ray.stages.reward_packing import row_width
from medgpt_ray.trainer_kit.checkpointing import SelectiveCheckpointing
from medgpt_ray.trainer_kit.length_bins import LengthBinSampler
from tests.stages.test_stages import EASY_PAIRS

# Bins of 1,024 tokens: the easy pairs' longer sides (111-153 tokens) pad to 128 (4 pairs a bin) or 256 (2), half
# of them each, so 6 pairs a step are 2 bins (2.7 pairs a bin on average).
SEQ_LEN = 512


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    return prepare_kind("preference", [str(repo / EASY_PAIRS)], tmp_path_factory.mktemp("data"), 0.25,
                        max_records=32)


def packed_inputs(data, tiny_model: Path, out: Path) -> StageInputs:
    """An rm stage planned in packed rows of pairs (what the driver plans for `packing: true`: 2 rows a micro-batch,
    half the layers checkpointed), whose worker does not pack: `packing: auto` leaves rm unpacked there, as a
    model whose attention packing cannot keep apart would (`true` on such a model is a ConfigError instead)."""
    cfg = RMStageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, seq_len=SEQ_LEN,
                        logging_steps=1, save_steps=100, warmup_ratio=0.0, max_steps=2, effective_batch=6,
                        packing="auto")
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_stage("rm", cfg, 1, False)
    plan = packed_rows(replace(plan, ckpt_fraction=0.5, micro_batch=2, grad_accum=3), cfg, 4, 1.5)
    return StageInputs("rm", cfg, plan, str(tiny_model), "chatml", data.train_file, data.eval_file, str(out))


def sampler_of(loader) -> LengthBinSampler:
    sampler = loader.base_dataloader.batch_sampler if hasattr(loader, "base_dataloader") else loader.batch_sampler
    assert isinstance(sampler, LengthBinSampler)
    return sampler


def test_a_packed_rm_plan_the_worker_cannot_pack_trains_pairs_padded_by_length(data, tiny_model, tmp_path):
    inp = packed_inputs(data, tiny_model, tmp_path / "first")
    records: list[dict] = []
    built = build_stage(inp, records.append)
    assert "padded by length" in built.extras["packing"]["planned_packed"]
    sent = [r[WORKER_PLAN] for r in records if WORKER_PLAN in r]
    assert len(sent) == 1  # to the driver, which writes it to plan.json (run/job.py take_worker_plan)
    plan = StagePlan.from_dict(sent[0])
    bins = plan.length_bins
    assert plan.packing is None and bins is not None
    assert bins["bin_tokens"] == row_width(SEQ_LEN) == 2 * SEQ_LEN and bins["sequences_per_example"] == 2
    assert bins["conversations_per_step"] == 6 == plan.examples_per_step  # still effective_batch pairs
    assert plan.micro_batch * plan.grad_accum == bins["bins_per_step"] and plan.micro_batch == 2
    assert "padded by length" in plan.reasons[-1] and "pairs a bin" in plan.reasons[-1]
    assert "padded by length: 2 bins of up to 1024 tokens" in plan_line(plan) and "pairs per worker" in plan_line(plan)
    # The packed plan's checkpointing trains, not the old fallback's every layer at one pair a micro-batch.
    assert plan.ckpt_fraction == 0.5 and [cb.fraction for cb in built.trainer.callback_handler.callbacks
                                          if isinstance(cb, SelectiveCheckpointing)] == [0.5]
    assert built.trainer.train_collate is None  # TRL's own padded pairs and loss
    assert (built.trainer.args.per_device_train_batch_size, built.trainer.args.gradient_accumulation_steps) == \
        (plan.micro_batch, plan.grad_accum)

    loader = built.trainer.get_train_dataloader()
    sampler = sampler_of(loader)
    pairs = []
    for batch in loader:  # TRL's collator: the chosen sequences, then the rejected, padded to the longest
        rows, width = batch["input_ids"].shape
        pairs.append(rows // 2)
        assert rows % 2 == 0 and rows * math.ceil(width / BUCKET) * BUCKET <= plan.micro_batch * bins["bin_tokens"]
    assert len(pairs) == len(loader) == len(sampler) > 0
    assert max(pairs) > plan.micro_batch  # short pairs: several a bin
    assert {i for b in sampler for i in b} == set(range(len(built.trainer.train_dataset)))  # each pair, each epoch

    built.trainer.train()
    losses = [h["loss"] for h in built.trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)

    # An OOM back-off halves the worker's plan (run/backoff.py); the next attempt trains its bins, fewer a
    # micro-batch, over the same steps in the same order.
    half = halve_micro_batch(plan, inp.cfg, "CUDA out of memory", 1)
    assert half is not None and half.length_bins == bins and (half.micro_batch, half.grad_accum) == (1, 2)
    again: list[dict] = []
    (tmp_path / "second").mkdir()
    retried = build_stage(replace(inp, plan=half, out_dir=str(tmp_path / "second")), again.append)
    assert not [r for r in again if WORKER_PLAN in r]  # the plan the driver already holds
    halved = sampler_of(retried.trainer.get_train_dataloader())
    assert halved.micro_bins == 1 and len(halved) == 2 * len(sampler)
    assert [i for b in halved for i in b] == [i for b in sampler for i in b]
