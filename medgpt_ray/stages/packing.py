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

from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch

from medgpt_ray.config import ConfigError

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


def pack(dataset: Any, seq_len: int) -> Any:
    """Encoded conversations (input_ids, labels) -> rows of at most seq_len tokens with their `seq_lengths`, by
    TRL's best-fit decreasing over the whole dataset at once (one map batch, so no bin is cut short)."""
    from trl.data_utils import pack_dataset

    columns = dataset.select_columns(["input_ids", "labels"])
    return pack_dataset(columns, seq_len, "bfd", {"batch_size": max(len(columns), 1)})


@dataclass(frozen=True)
class PackedShape:
    rows: int
    conversations: int
    tokens: int  # real (non-padding) tokens
    seq_len: int

    @classmethod
    def of(cls, packed: Any, seq_len: int) -> PackedShape:
        lengths = packed["seq_lengths"]
        return cls(len(lengths), sum(len(x) for x in lengths), sum(sum(x) for x in lengths), seq_len)

    @property
    def conversations_per_row(self) -> float:
        return self.conversations / max(self.rows, 1)

    def report(self) -> dict[str, Any]:
        """rows, conversations per row and fill (real tokens / the rows' seq_len slots), for the stage result."""
        return {"rows": self.rows, "conversations": self.conversations,
                "conversations_per_row": round(self.conversations_per_row, 3),
                "fill": round(self.tokens / max(self.rows * self.seq_len, 1), 4)}


# ---- batches --------------------------------------------------------------------------------------------------


def collate_rows(examples: list[dict[str, Any]], pad_id: int, width: int) -> dict[str, torch.Tensor]:
    """[rows, width] input_ids, labels and position_ids (restarting at 0 at each conversation and at the tail
    padding), no attention_mask; the first token of every conversation is no target (the previous conversation's
    last token must not learn to predict it).

    A row filled to the last token by its conversations ends in a one-token segment (its last position id is 0,
    its label kept): transformers returns no mask at all for a batch of rows that each look like one sequence, and
    compiled layers would compile again for that batch (bench: a 12 s step). The last token's output predicts
    nothing and no earlier token attends to it, so the loss and every gradient are unchanged."""
    rows = len(examples)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    labels = torch.full((rows, width), -100, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    for r, ex in enumerate(examples):
        lengths = list(ex["seq_lengths"])
        n = sum(lengths)
        input_ids[r, :n] = torch.as_tensor(ex["input_ids"])
        labels[r, :n] = torch.as_tensor(ex["labels"])
        position_ids[r] = torch.cat([torch.arange(k) for k in [*lengths, width - n] if k > 0])
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


def install(trainer: Any, collator: PackedCollator) -> None:
    """Train this trainer on packed rows: the shard loader collates with `collator` (stages/sharding.py), and the
    trainer (bound methods, its class untouched) counts the real tokens and conversations of every micro-batch."""
    trainer.medgpt_collate = collator
    trainer._medgpt_packed = {"conversations": 0, "last": None}  # last: (step, conversations) at the last log
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
                logs["conversations_per_step"] = (packed["conversations"] - conversations) / (
                    self.state.global_step - step)
                packed["last"] = (self.state.global_step, packed["conversations"])
        inner(logs, start_time)

    return log
