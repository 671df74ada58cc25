"""SFT packing, padding-free: the encoded conversations packed into rows of seq_len tokens, each attending only to
itself.

Rows are made by TRL's own best-fit-decreasing packer (`trl.data_utils.pack_dataset`, strategy "bfd"); every
conversation fits whole (encode_sft already cut it to seq_len), and labels stay as encode_sft made them
(response-only), with the first token of each conversation never a target, as in an unpacked row.

How the model keeps a row's conversations apart depends on its attention:
- SDPA and eager (what our users run): a micro-batch is [rows, seq_len] input_ids/labels/position_ids and NO
  attention_mask. Position ids restart at 0 at every conversation, so transformers' masking_utils
  (`find_packed_sequence_indices` in `create_causal_mask`) builds a causal mask that is block-diagonal per row.
  The row's tail padding restarts at 0 too (its own block, labels -100): it never joins the last conversation.
  transformers reads packed position ids only when the forward has no KV cache: training passes use_cache=False
  (TRL's loss and sync_free.py both do).
  That the loaded model really gets such a mask is checked before training (`attention_path`): the mask its first
  decoder layer receives for packed position ids must be exactly block-diagonal.
- FlashAttention: TRL's padding-free collator, as TRL means it: the micro-batch's rows flattened into one sequence
  with cu_seq_lens for the varlen kernel. (TRL's `packing=True` does this for every attention; under SDPA the
  flattened sequence gets one dense (rows x seq_len)^2 mask, hence our own rows path.)

effective_batch keeps counting conversations. The HF Trainer's accumulation is fixed, so a step is a fixed number of
packed rows, sized so that it holds about as many conversations as the plan's per-worker batch:
rows_per_step = round(planned conversations per step / conversations per row), the latter measured by packing the
first SAMPLE_RECORDS records of the train split (hash order: a uniform sample, the same on every worker, so every
worker takes the same accumulation without a collective). The pipeline measures it on the driver and plans the
micro-batch in rows (memory/lengths.py, plan.packing); a plan made without the data (a Tune trial) is sized here by
memory/stage_plan.packed_rows. The real number of conversations per step is logged (`conversations_per_step`).

Tokens are counted honestly: each packed micro-batch carries its number of real (non-padding) tokens and
conversations, which `install`'s training_step takes out of the batch before the model sees it and adds to
`state.num_input_tokens_seen` (gathered over ranks, as HF's own count is): tokens/s in metrics.jsonl, the progress
line and Prometheus are non-padding tokens. HF's own counter is off for packed stages: without an attention mask it
would compare input ids with the pad id, which is also a real token wherever pad = eos.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MethodType
from typing import Any

import torch

from medgpt_ray.config import ConfigError
from medgpt_ray.data.shards import read_records
from medgpt_ray.memory.lengths import RM_AUTO, SAMPLE_RECORDS, packing_setting, rows_per_step
from medgpt_ray.memory.stage_plan import packed_rows, unpacked
from medgpt_ray.stages.inputs import StageInputs

ROWS, FLAT = "rows", "flat"  # [rows, seq_len] with per-row masks (SDPA/eager); one flattened sequence (flash)
TOKENS_KEY, CONVERSATIONS_KEY = "medgpt_real_tokens", "medgpt_conversations"  # taken out before the model


# ---- which attention path packs ------------------------------------------------------------------------------


class _Stop(Exception):
    """Raised by the probe's hook: the forward has built its mask, nothing else needs to run."""


def _segments(position_ids: torch.Tensor) -> torch.Tensor:
    """Which conversation (or tail padding) each token belongs to: a new one wherever the position restarts at 0."""
    return (position_ids == 0).cumsum(-1)


def block_diagonal(position_ids: torch.Tensor) -> torch.Tensor:
    """[rows, L, L] bool: token i may attend to token j when both are in the same conversation and j <= i."""
    seg = _segments(position_ids)
    n = position_ids.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    return (seg[:, :, None] == seg[:, None, :]) & causal


def allowed_pairs(mask: Any) -> torch.Tensor | None:
    """A 4-D attention mask as [rows, L, L] bool "may attend" (SDPA's bool mask, or eager's additive 0/-inf);
    None when the model built none (plain causal attention: every earlier token, across conversations)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None
    first_head = mask[:, 0]
    return first_head if first_head.dtype == torch.bool else first_head == 0


def mask_the_model_builds(model: Any, position_ids: torch.Tensor) -> Any:
    """The attention mask the model's first decoder layer is given for these position ids and no attention_mask
    (the forward stops there: embeddings and mask only, cheap on any model size)."""
    from medgpt_ray.stages.checkpointing import decoder_layers

    layers = decoder_layers(model)
    if not layers:
        return None
    seen: dict[str, Any] = {}

    def capture(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")
        raise _Stop

    hook = layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    position_ids = position_ids.to(model.device)
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros_like(position_ids), position_ids=position_ids, use_cache=False)
    except _Stop:
        pass
    finally:
        hook.remove()
    return seen.get("mask")


# Two rows of 6 tokens as collate_rows makes them: conversations of 3 and 2 tokens and a 1-token tail; 2 and 4.
PROBE_POSITIONS = [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]


def attention_path(model: Any) -> tuple[str | None, str]:
    """(ROWS, FLAT or None, why) for this loaded model with this transformers."""
    import transformers

    impl = str(getattr(model.config, "_attn_implementation", None))
    if "flash" in impl:
        return FLAT, f"{impl}: TRL's padding-free batches (one flattened sequence per micro-batch, varlen kernel)"
    if impl not in ("sdpa", "eager"):
        return None, f"attention '{impl}' is not one packing is checked for (sdpa, eager, flash attention)"
    positions = torch.tensor(PROBE_POSITIONS)
    try:
        got = allowed_pairs(mask_the_model_builds(model, positions))
    except Exception as e:  # a model this probe cannot run: treated as not keeping conversations apart
        return None, f"the {impl} mask could not be read from this model ({type(e).__name__}: {e})"
    if got is None or not torch.equal(got.cpu(), block_diagonal(positions)):
        return None, (f"under {impl}, transformers {transformers.__version__} does not give this model a "
                      f"block-diagonal mask for packed position ids: conversations in a row would see each other")
    return ROWS, f"{impl}: a block-diagonal causal mask per row from the position ids (checked on this model)"


def resolve(setting: str | bool, model: Any, stage: str) -> tuple[str | None, str]:
    """The packing mode for the stage's `packing` setting and this model; true where unsupported is an error."""
    if setting is False:
        return None, "packing: false"
    mode, why = attention_path(model)
    if mode is None and setting is True:
        raise ConfigError(f"stages.{stage}.packing: true, but {why}; set it to auto (packs where the attention "
                          f"keeps conversations apart) or false")
    return mode, why


# ---- rows and steps -------------------------------------------------------------------------------------------


def pack(dataset: Any, seq_len: int, columns: Sequence[str] = ("input_ids", "labels")) -> Any:
    """Encoded examples (`columns`, one value per token: conversations' input_ids and labels, or a reward pair's
    tokens and position ids) -> rows of at most seq_len tokens with each example's length in `seq_lengths`, by
    TRL's best-fit decreasing over the whole dataset at once (one map batch, so no bin is cut short)."""
    from trl.data_utils import pack_dataset

    selected = dataset.select_columns(list(columns))
    return pack_dataset(selected, seq_len, "bfd", {"batch_size": max(len(selected), 1)})


@dataclass(frozen=True)
class PackedShape:
    rows: int
    conversations: int  # the examples packed: conversations, or reward pairs (stages/reward_packing.py)
    tokens: int  # real (non-padding) tokens
    seq_len: int  # the rows' width

    @classmethod
    def of(cls, packed: Any, seq_len: int) -> PackedShape:
        lengths = packed["seq_lengths"]
        return cls(len(lengths), sum(len(x) for x in lengths), sum(sum(x) for x in lengths), seq_len)

    @property
    def conversations_per_row(self) -> float:
        return self.conversations / max(self.rows, 1)

    def report(self, unit: str = "conversations") -> dict[str, Any]:
        """rows, examples (`unit`) per row and fill (real tokens / the rows' slots), for the stage result."""
        return {"rows": self.rows, unit: self.conversations,
                f"{unit}_per_row": round(self.conversations_per_row, 3),
                "fill": round(self.tokens / max(self.rows * self.seq_len, 1), 4)}


# ---- batches --------------------------------------------------------------------------------------------------


def segment_positions(lengths: Sequence[int], width: int) -> torch.Tensor:
    """A row's position ids: 0.. at every segment of `lengths`, and again at the tail padding up to `width`."""
    n = sum(lengths)
    return torch.cat([torch.arange(k) for k in [*lengths, width - n] if k > 0])


def row_tensors(examples: list[dict[str, Any]], pad_id: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] input_ids (pad_id after the real tokens) and position ids: the example's own `position_ids`
    where it has them (segments inside an example, as a reward pair's two sequences), else restarting at each of
    its `seq_lengths`; the tail padding is a segment of its own."""
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(examples), width), dtype=torch.long)
    for r, ex in enumerate(examples):
        n = len(ex["input_ids"])
        input_ids[r, :n] = torch.as_tensor(ex["input_ids"])
        if "position_ids" in ex:
            position_ids[r, :n] = torch.as_tensor(ex["position_ids"])
            position_ids[r, n:] = torch.arange(width - n)
        else:
            position_ids[r] = segment_positions(list(ex["seq_lengths"]), width)
    return input_ids, position_ids


def collate_rows(examples: list[dict[str, Any]], pad_id: int, width: int) -> dict[str, torch.Tensor]:
    """[rows, width] input_ids, labels and position_ids (restarting at 0 at each conversation and at the tail
    padding), no attention_mask; the first token of every conversation is no target (the previous conversation's
    last token must not learn to predict it).

    A row filled to the last token by its conversations ends in a one-token segment (its last position id is 0,
    its label kept): transformers returns no mask at all for a batch of rows that each look like one sequence, and
    compiled layers would compile again for that batch (bench: a 12 s step). The last token's output predicts
    nothing and no earlier token attends to it, so the loss and every gradient are unchanged."""
    rows = len(examples)
    input_ids, position_ids = row_tensors(examples, pad_id, width)
    labels = torch.full((rows, width), -100, dtype=torch.long)
    for r, ex in enumerate(examples):
        lengths = list(ex["seq_lengths"])
        n = sum(lengths)
        labels[r, :n] = torch.as_tensor(ex["labels"])
        if n == width:
            position_ids[r, -1] = 0
        starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        labels[r, starts] = -100
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


class PackedCollator:
    """The train loader's collate for packed rows; every batch also carries its real tokens and conversations
    (TOKENS_KEY, CONVERSATIONS_KEY), which install's training_step takes out before the model."""

    def __init__(self, mode: str, pad_id: int, seq_len: int):
        self.mode, self.pad_id, self.seq_len = mode, pad_id, seq_len
        if mode == FLAT:
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            self._flat = DataCollatorForLanguageModeling(pad_token_id=pad_id, padding_free=True)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = (self._flat(examples) if self.mode == FLAT else collate_rows(examples, self.pad_id, self.seq_len))
        lengths = [list(ex["seq_lengths"]) for ex in examples]
        batch[TOKENS_KEY] = torch.tensor(sum(sum(x) for x in lengths))
        batch[CONVERSATIONS_KEY] = torch.tensor(sum(len(x) for x in lengths))
        return batch


def install(trainer: Any, collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
            unit: str = "conversations") -> None:
    """Train this trainer on packed rows: the shard loader collates with `collator` (stages/sharding.py), and the
    trainer (bound methods, its class untouched) counts the real tokens and the examples (`unit`: conversations,
    pairs) of every micro-batch, logged as `<unit>_per_step`."""
    trainer.medgpt_collate = collator
    trainer._medgpt_packed = {"conversations": 0, "last": None, "unit": unit}  # last: (step, examples) at last log
    trainer.training_step = MethodType(_training_step, trainer)
    trainer.log = MethodType(_log_with(trainer.log), trainer)


def _training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
    # `inputs` is the loop's own dict: HF's token counter (off for packed stages) and FLOPs count read it after.
    counts = torch.stack([inputs.pop(TOKENS_KEY), inputs.pop(CONVERSATIONS_KEY)]).to(self.args.device)
    tokens, conversations = self.accelerator.gather(counts[None]).sum(0).tolist()
    packed = self._medgpt_packed
    if packed["last"] is None:  # the attempt's first micro-batch (a resumed one starts mid-way)
        packed["last"] = (self.state.global_step, 0)
    self.state.num_input_tokens_seen += int(tokens)
    packed["conversations"] += int(conversations)
    self._medgpt_batch_tokens = counts[0]  # this rank's real tokens, for TRL's num_tokens (sync_free.py)
    return type(self).training_step(self, model, inputs, num_items_in_batch)


def _log_with(inner: Callable[..., None]) -> Callable[..., None]:
    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        packed = self._medgpt_packed
        if "loss" in logs:
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen  # as HF logs it when it counts
        if "loss" in logs and packed["last"] is not None:
            step, conversations = packed["last"]
            if self.state.global_step > step:
                logs[f"{packed['unit']}_per_step"] = (packed["conversations"] - conversations) / (
                    self.state.global_step - step)
                packed["last"] = (self.state.global_step, packed["conversations"])
        inner(logs, start_time)

    return log


# ---- a stage's train split, packed --------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedKind:
    """How a stage kind packs: the examples `effective_batch` counts, how a worker encodes and packs them, how wide
    a row is, and the collate of its train rows. SFT: conversations in rows of seq_len (this module's); rm: pairs in
    rows of 2 x seq_len (stages/reward_packing.py)."""

    unit: str  # "conversations", "pairs"
    encode: Callable[..., tuple[Any, Any]]  # (records, tokenizer, template, seq_len) -> (dataset, skipped)
    pack: Callable[[Any, int], Any]  # (encoded dataset, seq_len) -> rows, one `seq_lengths` entry per example
    width: Callable[[int], int]  # seq_len -> the rows' width
    collator: Callable[[str, int, int], Callable[[list[dict[str, Any]]], dict[str, Any]]]  # (mode, pad id, seq_len)


def pack_train_split(inp: StageInputs, model: Any, tok: Any, template: Any, train_ds: Any, shard: dict[str, Any],
                     kind: PackedKind) -> tuple[StageInputs, Any, Any, dict[str, Any]]:
    """(inputs to train with, train dataset, train collator or None, the packing report) for the stage's `packing`
    and this model: the shard packed into rows, a step of as many rows as the plan says (planned on the driver from
    the split's lengths, memory/lengths.py), or, for a plan made without them, as hold about the planned examples
    in a sample packed here. A config class without the key stays unpacked."""
    plan, unit = inp.plan, kind.unit
    setting = packing_setting(inp.stage, inp.cfg)
    mode, why = resolve(setting, model, inp.stage)
    if setting is False and getattr(inp.cfg, "packing", False) == "auto":
        why = RM_AUTO
    if mode is None:
        report: dict[str, Any] = {"mode": None, "why": why}
        if plan.packing is not None:
            plan = unpacked(plan, inp.cfg)
            report["planned_packed"] = "fell back to 1 example per micro-batch with full checkpointing"
        return replace(inp, plan=plan), train_ds, None, report
    seq_len, width = inp.cfg.seq_len, kind.width(inp.cfg.seq_len)
    rows = kind.pack(train_ds, seq_len)
    shape = PackedShape.of(rows, width)
    if plan.packing is None:
        sample = shape
        if shard["rows"] != [0, shard["split_rows"]] or shard["split_rows"] > SAMPLE_RECORDS:
            # The split's first records size the step: the same on every worker, so all take the same accumulation.
            head = kind.encode(read_records(inp.train_file, 0, SAMPLE_RECORDS), tok, template, seq_len)
            sample = PackedShape.of(kind.pack(head[0], seq_len), width)
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
