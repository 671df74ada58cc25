"""What the memory model is asked about (TrainSetup: one stage's knobs) and what it answers (Estimate)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.memory.profiles import memory_kinds, memory_profile

GIB = 2**30


@dataclass(frozen=True)
class TrainSetup:
    stage: str
    method: str  # full | lora | qlora
    precision: str  # bf16 | amp-bf16 | fp32
    micro_batch: int
    seq_len: int
    ckpt_fraction: float = 1.0  # 0 none, 1 every layer, in between: that share of the layers
    fused_ce: bool = False
    zero: int = 0
    offload: str = "none"  # none | optimizer | all
    gpus: int = 1
    optim: str = "adamw"  # adamw | adamw-8bit
    lora_rank: int = 8
    lora_experts: bool = False  # lora.experts: the routed experts adapted too (memory/expert_lora.py)
    merge_experts: bool = True  # rollouts merge the experts' adapters (False: no host RAM for their copy)
    grad_accum: int = 1
    dpo_reference: str = "auto"  # auto (adapter-off policy for LoRA, a copy for full) | precomputed
    kl_batch: bool = False  # KTO's KL term: a no-grad forward of mismatched completions by policy and reference
    nll_term: bool = True  # a loss over full logits with an NLL term on the chosen half (kinds/orpo/memory.py)
    fused_kernels: bool = False  # Liger RMSNorm/SwiGLU/RoPE
    compiled: bool = False  # decoder layers compiled in place (stages/speed.py)
    packed: bool = False  # packed rows with a block-diagonal mask (sft: stages/packing.py, rm: reward_packing.py)
    # The attention kernel (sft's `attention`): sdpa keeps a dense block-diagonal mask per packed row, flex a
    # BlockMask of a few bytes per block.
    attention: str = "sdpa"
    # A hybrid's linear attention in training: on flash-linear-attention's kernels (True), on the PyTorch reference
    # (False), or not known (None: the GPU was not probed; priced by whether fla imports here).
    linear_kernels: bool | None = None
    generations: int = 0  # GRPO: completions per prompt (0: no generation phase; memory/generation.peak adds it)
    completion_len: int = 0  # GRPO: max completion tokens (seq_len is prompt + completion)
    reward_network: bool = False  # GRPO: a reward model network is resident (the reward_model reward)
    reward_adapter: bool = False  # GRPO: the reward is the rm's LoRA adapter + score head on the policy's base
    reward_lora_rank: int = 0  # that adapter's rank (the rm stage's lora.rank); 0: taken as this stage's
    reference: bool = False  # GRPO: a KL term (beta > 0): a reference pass; a frozen copy for full training
    reward_model_gpu: bool = False  # GRPO: the reward model in an actor on a device of its own (reward_model_gpu)
    gen_steps: int = 0  # GRPO: micro-batches per generate call (TRL's steps_per_generation); 0: grad_accum
    generation_path: str = "auto"  # GRPO/opd: the decode path asked for (auto | dynamic | static, the config key)
    generation_on_gpu: bool = False  # GRPO/opd: the rollouts run on a GPU (where a static path compiles)
    kind_terms: Any = None  # (shape, setup) -> KindTerms: a kind's own networks (memory/kind_memory.py)

    def generation_batch(self) -> int:
        """Completions one generate call holds on one worker (TRL's default: one call per optimizer step)."""
        return self.micro_batch * (self.gen_steps or self.grad_accum)

    def sequences(self) -> int:
        """Sequences in one forward: rm, dpo and orpo score chosen and rejected together; kto one per example."""
        return self.micro_batch * memory_profile(self.stage).sequences_per_example

    def tokens(self) -> int:
        return self.sequences() * self.seq_len


@dataclass
class Estimate:
    peak_bytes: float
    breakdown: dict[str, float] = field(default_factory=dict)  # bytes, the terms of the peak moment
    moment: str = ""
    # Pinned host RAM one worker holds for CPU offload (DeepSpeed's offloaded partitions), not GPU memory.
    host_bytes: float = 0.0

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def host_gib(self) -> float:
        return self.host_bytes / GIB

    def breakdown_gib(self) -> dict[str, float]:
        return {k: round(v / GIB, 3) for k, v in self.breakdown.items() if v}


class SetupError(ValueError):
    pass


def check_setup(s: TrainSetup) -> None:
    kinds = memory_kinds()
    if s.stage not in kinds:
        raise SetupError(f"stage {s.stage!r}: one of {', '.join(kinds)}")
    profile = memory_profile(s.stage)
    if s.method not in ("full", "lora", "qlora"):
        raise SetupError(f"method {s.method!r}: one of full, lora, qlora")
    if s.precision not in ("bf16", "amp-bf16", "fp32"):
        raise SetupError(f"precision {s.precision!r}: one of bf16, amp-bf16, fp32")
    if s.zero not in (0, 1, 2, 3):
        raise SetupError(f"zero {s.zero}: one of 0, 1, 2, 3")
    if s.offload not in ("none", "optimizer", "all"):
        raise SetupError(f"offload {s.offload!r}: one of none, optimizer, all")
    if s.offload != "none" and s.zero == 0:
        raise SetupError(f"offload {s.offload!r} needs ZeRO (--zero 1, 2 or 3)")
    if s.offload == "all" and s.zero != 3:
        raise SetupError("offload 'all' (parameters too) needs ZeRO-3")
    if s.method == "qlora" and s.zero == 3:
        raise SetupError("ZeRO-3 cannot shard 4-bit QLoRA weights")
    if s.lora_experts and (s.method == "full" or s.zero == 3):
        raise SetupError("LoRA on the routed experts (lora.experts) needs method lora or qlora, without ZeRO-3")
    if s.fused_kernels and not profile.fused_kernels:
        raise SetupError("fused kernels (Liger) are applied to the causal-LM stages: pt, sft, dpo, orpo, kto")
    if s.fused_ce and profile.fused_ce_setup_error:
        raise SetupError(f"{s.stage}: {profile.fused_ce_setup_error}")
    if s.method == "qlora" and s.precision == "fp32":
        raise SetupError("QLoRA computes in bf16: precision bf16")
    if not 0 <= s.ckpt_fraction <= 1:
        raise SetupError(f"ckpt fraction {s.ckpt_fraction}: between 0 and 1")
    if s.micro_batch < 1 or s.seq_len < 1 or s.gpus < 1 or s.grad_accum < 1:
        raise SetupError("micro-batch, sequence length, GPUs and accumulation must be >= 1")


def merges_adapters(s: TrainSetup) -> bool:
    """The rollouts decode on the LoRA adapter merged into the base (trainer_kit/merged_rollouts.py): no adapter
    kernels in the decode step."""
    return bool(s.generations) and s.method == "lora" and s.zero != 3
