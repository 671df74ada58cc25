"""The sft kind's config: supervised fine-tuning on conversations (data.sft), from pt's model. Sits with config/
(docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Literal

from medgpt_ray.config.base import Auto, ByLength
from medgpt_ray.config.registry import StageKind, register_stage_kind
from medgpt_ray.config.stage import LengthGroupedStageConfig


class SFTStageConfig(LengthGroupedStageConfig):
    packing: Auto | bool | ByLength = "auto"
    """Pack the conversations into rows of `seq_len` tokens (best-fit decreasing), each conversation attending
    only to itself (position ids restart at every conversation); labels unchanged. auto: on where the model's
    attention keeps a row's conversations apart (SDPA and eager, checked on the loaded model; FlashAttention), and
    padded by length elsewhere (as by_length); true there is an error. by_length: never packed; micro-batches of
    conversations of similar length, padded, each bin at most a packed row's tokens (short conversations fill a
    micro-batch with many rows), the loss over the step's real tokens as packed. false: micro-batches of
    `micro_batch` conversations padded to their longest (TRL's layout). `effective_batch` still counts
    conversations: a step takes as many packed rows (or bins) as hold about that many (the real count is logged as
    conversations_per_step). Not a memory knob: it changes which conversations share a step, so it is in the
    fingerprint."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """The attention kernel of the model's attention layers. sdpa: PyTorch's SDPA, packed rows with a dense
    block-diagonal mask per row (its memory is planned); flex: PyTorch's flex attention (transformers'
    `flex_attention`), packed rows with a BlockMask that skips the blocks outside every conversation and keeps no
    dense mask (GPU only: it has no CPU backward; compiled on its first step); auto: sdpa. A memory knob."""


register_stage_kind(StageKind("sft", SFTStageConfig, "sft", "pt"))
