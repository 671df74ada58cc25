"""A stage's train split, packed (trainer_kit/packed_rows.py says how rows are made and batched): the packing mode
for the stage's `packing` setting and the loaded model, the shard packed into rows, and the plan's step in rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from medgpt_ray.config import overlong_policy
from medgpt_ray.config.base import BY_LENGTH
from medgpt_ray.data.shards import read_records
from medgpt_ray.memory.lengths import SAMPLE_RECORDS, packing_setting, rows_per_step
from medgpt_ray.memory.profiles import stage_packing, stage_profile
from medgpt_ray.memory.stage_plan import StagePlan, bin_shape, binned, packed_rows
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.trainer_args import group_by_length
from medgpt_ray.trainer_kit.length_bins import examples_per_bin
from medgpt_ray.trainer_kit.packed_attention import resolve
from medgpt_ray.trainer_kit.packed_rows import PackedShape, pack
from medgpt_ray.trainer_kit.shard_sampler import example_lengths

__all__ = ["PackedKind", "PackedShape", "pack", "pack_train_split"]  # pack, PackedShape: stages/length_profile.py


@dataclass(frozen=True)
class PackedKind:
    """How a stage kind packs: the examples `effective_batch` counts, how a worker encodes and packs them, how wide
    a row is, and the collate of its train rows. SFT: conversations in rows of seq_len (this module's); rm: pairs in
    rows of 2 x seq_len (stages/reward_packing.py)."""

    unit: str  # "conversations", "pairs"
    encode: Callable[..., tuple[Any, Any]]  # (records, tokenizer, template, seq_len, overlong) -> (dataset, skipped)
    pack: Callable[[Any, int], Any]  # (encoded dataset, seq_len) -> rows, one `seq_lengths` entry per example
    width: Callable[[int], int]  # seq_len -> the rows' width
    collator: Callable[[str, int, int], Callable[[list[dict[str, Any]]], dict[str, Any]]]  # (mode, pad id, seq_len)


def pack_train_split(inp: StageInputs, model: Any, tok: Any, template: Any, train_ds: Any, shard: dict[str, Any],
                     kind: PackedKind, sink: Callable[[dict[str, Any]], None] | None = None
                     ) -> tuple[StageInputs, Any, Any, dict[str, Any]]:
    """(inputs to train with, train dataset, train collator or None, the packing report) for the stage's `packing`
    and this model: the shard packed into rows, a step of as many rows as the plan says (planned on the driver from
    the split's lengths, memory/lengths.py), or, for a plan made without them, as hold about the planned examples
    in a sample packed here. A config class without the key stays unpacked. A plan changed here goes to `sink`
    (the driver's progress channel) from the first worker, so the job writes what trains to plan.json."""
    packed_inp, rows, collator, report = _pack_train_split(inp, model, tok, template, train_ds, shard, kind)
    if packed_inp.plan != inp.plan and sink is not None and shard.get("rank", 0) == 0:
        sink(worker_plan_record(inp.stage, packed_inp.plan))
    return packed_inp, rows, collator, report


WORKER_PLAN = "worker_plan"  # the key of a progress record that carries the plan a worker trains with


def worker_plan_record(stage: str, plan: StagePlan) -> dict[str, Any]:
    return {"stage": stage, WORKER_PLAN: plan.to_dict()}


def _pack_train_split(inp: StageInputs, model: Any, tok: Any, template: Any, train_ds: Any, shard: dict[str, Any],
                      kind: PackedKind) -> tuple[StageInputs, Any, Any, dict[str, Any]]:
    plan, unit = inp.plan, kind.unit
    setting = packing_setting(inp.stage, inp.cfg)
    mode, why = resolve(setting, model, inp.stage)
    if setting is False and stage_packing(inp.stage, inp.cfg) == "auto":
        why = stage_profile(inp.stage).auto_unpacked_reason
    if mode is None:
        report: dict[str, Any] = {"mode": None, "why": why}
        if plan.packing is None and setting == BY_LENGTH:  # planned without the lengths: as packed rows, sampled here
            per_row = _sampled_shape(inp, tok, template, kind).conversations_per_row
            plan = packed_rows(plan, inp.cfg, rows_per_step(plan.per_worker_examples, per_row), per_row)
        if plan.packing is not None:  # padded by length, bins of a packed row's tokens (sft and rm alike)
            tokens, sequences = bin_shape(plan, inp.cfg)
            per_bin = examples_per_bin(_sample_lengths(inp, tok, template, kind), tokens, sequences)
            plan = binned(plan, inp.cfg, per_bin, asked=setting == BY_LENGTH)
        if plan.length_bins is not None:  # binned here, or by the first attempt (then halved by an OOM back-off)
            shard["length_bins"] = plan.length_bins
            report["planned_packed"] = (f"padded by length instead: {plan.length_bins['bins_per_step']} bins a step "
                                        f"of up to {plan.length_bins['bin_tokens']} tokens")
        if setting == "auto" or plan.length_bins is not None:  # said where the user reads the stage's progress
            _say_unpacked(inp, plan, why, shard)
        return replace(inp, plan=plan), train_ds, None, report
    seq_len, width = inp.cfg.seq_len, kind.width(inp.cfg.seq_len)
    rows = kind.pack(train_ds, seq_len)
    shape = PackedShape.of(rows, width)
    if plan.packing is None:
        sample = shape
        if shard["rows"] != [0, shard["split_rows"]] or shard["split_rows"] > SAMPLE_RECORDS:
            sample = _sampled_shape(inp, tok, template, kind)
        plan = packed_rows(plan, inp.cfg, rows_per_step(plan.per_worker_examples, sample.conversations_per_row),
                           sample.conversations_per_row)
    assert plan.packing is not None
    per_step, per_row = int(plan.packing["rows_per_step"]), float(plan.packing["conversations_per_row"])
    shard["packed"] = shape.report(unit)
    report = {"mode": mode, "why": why, **shape.report(unit), "rows_per_step": per_step,
              "micro_batch_rows": plan.micro_batch, "grad_accum": plan.grad_accum,
              f"sampled_{unit}_per_row": round(per_row, 3),
              f"{unit}_per_step_expected": round(per_step * per_row * plan.num_workers, 1)}
    return replace(inp, plan=plan), rows, kind.collator(mode, tok.pad_token_id, seq_len), report


def _sampled_shape(inp: StageInputs, tok: Any, template: Any, kind: PackedKind) -> PackedShape:
    """The split's first records packed: the same on every worker, so all take the same accumulation."""
    seq_len = inp.cfg.seq_len
    head = kind.encode(read_records(inp.train_file, 0, SAMPLE_RECORDS), tok, template, seq_len,
                       overlong_policy(inp.cfg))
    return PackedShape.of(kind.pack(head[0], seq_len), kind.width(seq_len))


def _sample_lengths(inp: StageInputs, tok: Any, template: Any, kind: PackedKind) -> Any:
    """The lengths of the split's first records as the stage encodes them: the same on every worker, so every rank
    sizes the same bins per step (as packed rows are sized from them)."""
    head, _ = kind.encode(read_records(inp.train_file, 0, SAMPLE_RECORDS), tok, template, inp.cfg.seq_len,
                          overlong_policy(inp.cfg))
    return example_lengths(head)


def _say_unpacked(inp: StageInputs, plan: StagePlan, why: str, shard: dict[str, Any]) -> None:
    """One line on the first worker: the stage trains padded (`packing: auto` on this model, or a packed plan its
    model cannot pack), how, and why."""
    if shard.get("rank", 0) == 0:
        if plan.length_bins is not None:
            how = (f"padded by length, micro-batches of {plan.micro_batch} bins of up to "
                   f"{plan.length_bins['bin_tokens']} tokens ({stage_profile(inp.stage).packed_unit})")
        else:
            grouped = ", grouped by length" if plan.micro_batch > 1 and group_by_length(inp) else ""
            how = f"padded micro-batches of {plan.micro_batch}{grouped}"
        setting = str(stage_packing(inp.stage, inp.cfg)).lower()
        because = "" if setting == BY_LENGTH else f", not packed: {why}"
        print(f"[{inp.stage}] packing: {setting} -> {how}{because}", flush=True)
