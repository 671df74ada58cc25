"""The real RM and DPO train loaders on the tiny model, in a plain process (built, not trained): with compiled layers
every micro-batch's sequence dimension is one of the bucket lengths (multiples of 128 up to seq_len), grouping by
length fills the batches better than random batches, and a back-off's split (half the micro-batch, twice the
accumulation) trains the same pairs in every step. (The sampler alone: tests/unit/test_length_batches.py.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from medgpt_ray.config import DPOStageConfig, LoraConfig, RMStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.lengths import BUCKET
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.inputs import StageInputs
from tests.stages.test_stages import EASY_PAIRS

SEQ_LEN = 512
CONFIGS = {"rm": RMStageConfig, "dpo": DPOStageConfig}


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    # Pairs of 80-150 tokens, so that their batches fall into more than one bucket (the shipped sample's pairs are
    # all shorter than one).
    return prepare_kind("preference", [str(repo / EASY_PAIRS)], tmp_path_factory.mktemp("data"), 0.1,
                        max_records=96)


def loader_batches(stage: str, data, model: Path, out: Path, compile_layers: bool = True, **cfg) -> tuple:
    """The stage's train batches of one epoch as its trainer's loader yields them, and the shard report."""
    kw = dict(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), seq_len=SEQ_LEN, effective_batch=8,
              micro_batch=2, epochs=1, logging_steps=1, save_steps=100)
    if stage == "rm":
        kw["packing"] = False  # padded batches (packed rows: tests/stages/test_reward_packing.py)
    config = CONFIGS[stage](**{**kw, **cfg})
    plan = plan_stage(stage, config, 1, False)
    # as on a GPU; the layers are only compiled when training starts, never here
    plan = replace(plan, compile=compile_layers)
    out.mkdir(parents=True, exist_ok=True)
    built = build_stage(StageInputs(stage, config, plan, str(model), "chatml", data.train_file, data.eval_file,
                                    str(out)))
    trainer = built.trainer
    return list(trainer.get_train_dataloader()), trainer.shard_info, trainer.args.gradient_accumulation_steps


def pairs_per_step(batches: list, accum: int) -> list[list[tuple[int, ...]]]:
    """Each optimizer step's chosen sequences (the first half of a preference batch's rows), unpadded, in order."""
    steps: list[list[tuple[int, ...]]] = []
    for k, batch in enumerate(batches):
        if k % accum == 0:
            steps.append([])
        ids, mask = batch["input_ids"], batch["attention_mask"]
        half = ids.shape[0] // 2
        steps[-1] += [tuple(ids[r][mask[r].bool()].tolist()) for r in range(half)]
    return steps


@pytest.mark.parametrize("stage", ["rm", "dpo"])
def test_compiled_batches_are_bucket_lengths_and_grouping_pads_less(stage, data, tiny_model, tmp_path):
    grouped, shard, _ = loader_batches(stage, data, tiny_model, tmp_path / "g")
    widths = {b["input_ids"].shape[1] for b in grouped}
    assert widths <= set(range(BUCKET, SEQ_LEN + 1, BUCKET)) and len(widths) >= 2, widths
    assert shard["group_by_length"] and shard["padded_lengths"] == len(widths)
    plain, plain_shard, _ = loader_batches(stage, data, tiny_model, tmp_path / "p", compile_layers=False,
                                           group_by_length=False)
    assert not plain_shard["group_by_length"]
    assert len({b["input_ids"].shape[1] for b in plain}) > len(widths)  # eager: padded to each batch's longest
    ungrouped, ungrouped_shard, _ = loader_batches(stage, data, tiny_model, tmp_path / "u", group_by_length=False)
    assert shard["fill"] > ungrouped_shard["fill"], (shard["fill"], ungrouped_shard["fill"])


def test_a_back_off_split_trains_the_same_pairs_per_step(data, tiny_model, tmp_path):
    two, _, accum_two = loader_batches("rm", data, tiny_model, tmp_path / "2", micro_batch=2)
    one, _, accum_one = loader_batches("rm", data, tiny_model, tmp_path / "1", micro_batch=1)
    assert (accum_two, accum_one) == (4, 8)
    assert pairs_per_step(two, accum_two) == pairs_per_step(one, accum_one)
