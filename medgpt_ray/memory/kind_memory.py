"""What a stage kind's memory module (`kinds/<kind>/memory.py`, its `MEMORY`) gives memory/: the profile of its
trainer when the kind is a memory kind (what estimator, planner, throughput, lengths and generation price instead of
comparing kind names), the TrainSetup fields its own config keys decide, its own networks, and its `packing` key.

memory/profiles.py finds a kind's module by the kind's registered name (docs/ARCHITECTURE.md, "The stage-kind
contract"). The kinds' memory modules import this module and the other leaves of memory/ (shapes), never the ones
that look the kinds up (profiles, setup, estimator and what imports them): tests/unit/test_import_rules.py checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# HF's default causal-LM loss per logit at its peak: bf16 logits (2) upcast to fp32 (4), log_softmax's saved
# fp32 output (4), and part of the fp32 gradient in flight. Measured: 10.6 B/logit (Qwen2.5-0.5B, 4x1024 tokens).
HF_LOSS_BYTES_PER_LOGIT = 10.6

CHUNKED_HEAD = "false is not available: TRL computes the {stage} loss with its chunked LM head (no full logits) in " \
    "every run"


@dataclass(frozen=True)
class MemoryProfile:
    """What one memory kind's trainer does that memory/ prices: each field replaces a branch on the kind's name."""

    name: str
    # Per-token activations relative to the same model under SFT at equal token counts (estimator).
    activation_scale: float = 1.0
    # (method, scale) where a training method keeps other than `activation_scale`.
    method_activation_scale: tuple[tuple[str, float], ...] = ()
    sequences_per_example: int = 1  # chosen and rejected in one forward: 2
    reference: bool = False  # scores against a reference model (adapter-off policy for LoRA, a frozen copy for full)
    score_head: bool = False  # a 1-wide score head instead of the LM head: no vocabulary logits, no loss over them
    # The loss over vocabulary logits: TRL's chunked LM head in every run (no full logits), else full logits at
    # `logit_loss_bytes` per logit (without an NLL term: `logit_loss_bytes_no_nll`) unless fused CE chunks them.
    chunked_head: bool = False
    logit_loss_bytes: float = HF_LOSS_BYTES_PER_LOGIT
    logit_loss_bytes_no_nll: float | None = None
    # Liger's fused linear CE trains the LM head inside the loss: its fp32 grad is live at the loss (full training).
    fused_ce_head_grad: bool = False
    loss_path_efficiency: float = 1.0  # what the trainer's own loss code costs beyond the FLOP model (throughput)
    # The fused_ce values the trainer allows, and the sentence that refuses the other ({stage}: the stage's name).
    fused_ce_allowed: tuple[bool, ...] = (True,)
    fused_ce_refusal: str = CHUNKED_HEAD
    liger_fused_ce: bool = False  # fused CE is Liger's fused linear CE (GPU, liger-kernel), searched when present
    # A TrainSetup that asks the estimator for fused CE the trainer cannot do (None: the estimator accepts it).
    fused_ce_setup_error: str | None = None
    fused_kernels: bool = True  # Liger's/compiled fused RMSNorm/SwiGLU/RoPE apply (causal-LM layers)
    kernels_refusal: str = ""  # why not, where they do not
    compiled_layer_scale: float = 1.0  # compiled layers' saved activations relative to eager ones
    blocks: bool = False  # trains on fixed blocks of seq_len (pretraining packs its text): no length planning
    packs: bool = False  # may train on packed rows (stages/packing.py, reward_packing.py)
    packed_unit: str = ""  # what a packed row holds
    packed_row_sequences: int = 1  # a packed row is this many x seq_len wide (whole pairs: 2)
    packs_on_auto: bool = True  # `packing: auto` packs (memory/lengths.py's packing_setting)
    auto_unpacked_reason: str = ""  # what the worker reports where `packing: auto` leaves the kind unpacked

    def scale_for(self, method: str) -> float:
        """The activation scale for a training method (full, lora, qlora)."""
        return dict(self.method_activation_scale).get(method, self.activation_scale)

    def loss_bytes_per_logit(self, nll_term: bool) -> float:
        """Bytes per vocabulary logit of a loss over the full logits."""
        if not nll_term and self.logit_loss_bytes_no_nll is not None:
            return self.logit_loss_bytes_no_nll
        return self.logit_loss_bytes


@dataclass(frozen=True)
class KindTerms:
    """A kind's own networks (opd's frozen teacher, for one), added to the estimator's terms."""

    resident: dict[str, float] = field(default_factory=dict)  # bytes held in every phase (a frozen network)
    training: dict[str, float] = field(default_factory=dict)  # bytes added at backward start (its forward, its loss)


class PlannedSetup(Protocol):
    """What a kind's terms read of the TrainSetup they are priced for (memory/setup.py's TrainSetup, not imported
    here: it asks the profiles, which load the kinds' memory modules)."""

    precision: str
    micro_batch: int
    seq_len: int
    zero: int

    def tokens(self) -> int: ...


def no_fields(cfg: Any, use_gpu: bool) -> dict[str, Any]:
    return {}


def no_packing(cfg: Any) -> bool:
    return False


def no_hints(cfg: Any, s: Any) -> list[tuple[str, dict[str, Any]]]:
    return []


@dataclass(frozen=True)
class KindMemory:
    """A stage kind's memory module's answer (its `MEMORY`); a kind without a module reads none of its keys here.

    setup_fields(cfg, use_gpu): the TrainSetup fields the stage's own keys decide (cfg: the kind's own config class),
    laid over the planner's knobs with dataclasses.replace; among them may be `kind_terms`, a function
    (shape, setup) -> KindTerms of the kind's own networks: the resident ones in every phase, the training ones at
    the start of backward. It may raise ConfigError for a setting the planned resources cannot run.
    packing(cfg): the stage's `packing` key (auto, true, false) for a kind that has one; False otherwise.
    hints(cfg, setup): what the kind's own keys could change where nothing fits, as (the key and value for people,
    the TrainSetup fields that change); memory/no_fit.py prices each and says whether it fits."""

    profile: MemoryProfile | None = None  # a memory kind's; None: the kind follows another's (its memory_model)
    setup_fields: Callable[[Any, bool], dict[str, Any]] = no_fields
    packing: Callable[[Any], Any] = no_packing
    hints: Callable[[Any, Any], list[tuple[str, dict[str, Any]]]] = no_hints
