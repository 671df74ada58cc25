"""The length distribution of a stage's training data, and the sequence length its memory is planned for.

A stage's `seq_len` is a cap, not the length its batches have: real medical SFT data is mostly a few dozen tokens,
with consultations of hundreds and a tail of long multi-turn conversations. The pipeline tokenizes a sample of
each stage's train split (stages/length_profile.py, on the driver, after data preparation) and plans with it:

- packed SFT: rows are always seq_len long; what the data decides is how many conversations a row holds, hence
  how many rows a step of `effective_batch` conversations needs (the micro-batch is searched among its divisors);
  packed rm the same with pairs in rows of 2 x seq_len (a row has the tokens of one pair at its longest);
- padded batches (dpo, unpacked sft and rm): a micro-batch is as long as its longest row, so memory is planned at the
  sample's longest row (with a guard when the sample is not the whole split, rounded up to the padding bucket),
  never above seq_len.

Where the data cannot be read (planning a cluster config on a laptop, `medgpt-ray memory`) the plan assumes rows of
seq_len and says so. The OOM back-off stays the safety net for a row longer than any the sample held.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from medgpt_ray.config import StageConfig
from medgpt_ray.config.base import BY_LENGTH
from medgpt_ray.memory.profiles import stage_packing, stage_profile

SAMPLE_RECORDS = 2048  # records of the train split tokenized to plan (hash order: a uniform sample)
# Compiled layers see each micro-batch's sequence length. Padded to its own longest row, that is a new length nearly
# every step. bench/results/compile_shapes_probe_h200.jsonl (LoRA DPO's passes over 4 compiled Qwen2.5-1.5B-shaped
# layers, 8 rows of a random 200-1,024-token length per step): unbucketed, steps after warm-up stalled for 5.1 and
# 3.8 s at new lengths and the others took 0.25-0.4 s; padded up to multiples of 128, nothing compiled after step 1
# but the first evaluation, a bucket seen before ran in 0.04-0.06 s and a new bucket's first step took ~0.3 s.
# 128 bounds the lengths at seq_len / 128 and the padding at 127 tokens a row (little once steps are grouped by
# length, trainer_kit/shard_sampler.py), and is a multiple of the attention kernels' tiles.
BUCKET = 128
PAD_MULTIPLE = BUCKET  # padded batches are planned at a multiple of this (the bucket, when compiled)
UNSAMPLED_GUARD = 1.15  # a sample's longest row times this, when the split has rows the sample did not see


def percentile(sorted_values: list[int], q: float) -> int:
    """The nearest-rank q-th percentile of sorted values (0 for none)."""
    if not sorted_values:
        return 0
    k = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return int(sorted_values[k])


@dataclass(frozen=True)
class LengthProfile:
    """Tokens per training example (a conversation, or the longer side of a preference pair) as the stage
    encodes it, over a sample of its train split; with packing, how many conversations a packed row held."""

    records: int  # the train split's records
    sampled: int  # of which read here (the lengths are of those the stage trains on)
    p50: int
    p95: int
    p99: int
    max: int
    seq_len: int
    over_seq_len: int  # sampled examples that reached seq_len (cut to it, or left out by the stage)
    conversations_per_row: float | None = None  # packed: the sample's conversations (rm: pairs) per packed row
    unit: str = "tokens"

    @classmethod
    def of(cls, lengths: list[int], records: int, seq_len: int, conversations_per_row: float | None = None,
           over_seq_len: int = 0, sampled: int | None = None) -> LengthProfile:
        """`sampled`: the records read (default: one per length; more where the stage left some out)."""
        s = sorted(lengths)
        return cls(records=records, sampled=len(s) if sampled is None else sampled, p50=percentile(s, 50),
                   p95=percentile(s, 95), p99=percentile(s, 99), max=s[-1] if s else 0, seq_len=seq_len,
                   over_seq_len=over_seq_len, conversations_per_row=conversations_per_row)

    @property
    def whole_split(self) -> bool:
        return self.sampled >= self.records

    def padded_len(self) -> int:
        """The sequence length a padded micro-batch is planned at: the longest sampled row (times the guard when
        the split holds rows the sample did not see), rounded up to PAD_MULTIPLE, at most seq_len."""
        longest = self.max if self.whole_split else math.ceil(self.max * UNSAMPLED_GUARD)
        return max(1, min(self.seq_len, math.ceil(longest / PAD_MULTIPLE) * PAD_MULTIPLE))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        head = (f"{self.sampled:,} of {self.records:,} train examples: p50 {self.p50:,}, p95 {self.p95:,}, "
                f"max {self.max:,} tokens")
        if self.over_seq_len:
            head += f" ({self.over_seq_len} reach seq_len {self.seq_len:,})"
        if self.conversations_per_row is not None:
            head += f"; packed {self.conversations_per_row:.1f} examples per packed row"
        return head


def rows_per_step(conversations_per_step: int, conversations_per_row: float) -> int:
    """Packed rows per worker per step holding about `conversations_per_step` conversations (at least one row)."""
    return max(1, round(conversations_per_step / max(conversations_per_row, 1e-9)))


def packed_width(stage: str, seq_len: int) -> int:
    """The width of a stage's packed rows: seq_len, and 2 x seq_len for rm-kind stages (whole pairs a row)."""
    return stage_profile(stage).packed_row_sequences * seq_len


def packing_setting(stage: str, cfg: StageConfig) -> str | bool:
    """The stage's `packing` as the planner, the length profile and the worker read it: false for a kind without
    the key, and for `auto` where the kind's profile does not pack on auto (its auto_unpacked_reason)."""
    setting = stage_packing(stage, cfg)
    if setting == "auto" and not stage_profile(stage).packs_on_auto:
        return False
    return setting


def packing_reason(stage: str, seq_len: int, per_worker: int, rows: int, per_row: float) -> str:
    """The plan's reason for a packed step of `rows` rows holding about `per_worker` examples."""
    unit = stage_profile(stage).packed_unit
    return (f"packing: {per_worker} {unit} per worker step in {rows} rows of {packed_width(stage, seq_len)} tokens "
            f"({per_row:.1f} {unit} per row in the sample)")


def packs(stage: str, cfg: StageConfig, lengths: LengthProfile | None) -> bool:
    """Whether the stage is planned in packed rows: an SFT- or RM-kind stage with `packing` not false whose data
    was packed on the driver (the worker checks the attention path; stages/packing.py falls back safely where it
    fails, and bins `packing: by_length` stages by length within those rows' tokens)."""
    return (lengths is not None and lengths.conversations_per_row is not None
            and stage_profile(stage).packs and stage_packing(stage, cfg) is not False)


def planned_seq_len(stage: str, cfg: StageConfig, lengths: LengthProfile | None, reasons: list[str]) -> int:
    """The sequence length memory is planned at, with its reason."""
    if stage_profile(stage).blocks:
        reasons.append(f"lengths: pretraining packs its text into blocks of seq_len {cfg.seq_len}")
        return cfg.seq_len
    if lengths is None:
        reasons.append(f"lengths: the train data was not read here; planned for rows of seq_len {cfg.seq_len}")
        return cfg.seq_len
    if packs(stage, cfg, lengths):
        width = packed_width(stage, cfg.seq_len)
        reasons.append(f"lengths: {lengths.describe()}; " + (
            f"padded by length (packing: by_length) in bins of up to {width} tokens, planned as packed rows that long"
            if stage_packing(stage, cfg) == BY_LENGTH else f"packed rows are {width} tokens long"))
        return cfg.seq_len
    planned = lengths.padded_len()
    guard = "" if lengths.whole_split else " with a guard for rows the sample did not see"
    reasons.append(f"lengths: {lengths.describe()}; padded micro-batches planned at {planned} tokens (the longest "
                   f"sampled row{guard}, at most seq_len {cfg.seq_len})")
    return planned
