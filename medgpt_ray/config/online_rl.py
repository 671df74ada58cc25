"""What the online-RL stage kinds (grpo, rloo) share: prompt records (data.prompt), completions sampled by the
trainer's own generate, scored by reward functions by name (stages/rewards.py). The keys both share live in
OnlineRLStageConfig; each kind adds its trainer's own in kinds/<kind>/config.py, which registers it
(docs/ARCHITECTURE.md, "The stage-kind contract")."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from medgpt_ray.config.base import Auto
from medgpt_ray.config.registry import reward_model_kind
from medgpt_ray.config.stage import OverlongStageConfig, StageConfig

BUILTIN_REWARDS = ("accuracy", "format", "length", "reward_model")
# How a generating stage decodes (generation/decode_path.py); shared with opd's config.
GenerationPath = Literal["auto", "dynamic", "static"]


class OnlineRLStageConfig(OverlongStageConfig):
    """An online-RL stage: each step samples `num_generations` completions per prompt with the trainer's own
    generate, scores them with `reward_funcs`, and trains on advantages taken within each prompt's group.
    `effective_batch` counts completions (TRL's unit): prompts per step x num_generations; each worker's share must
    hold whole groups. `seq_len` bounds prompt + completion: a prompt longer than seq_len - max_completion_length
    keeps its end (`overlong: truncate`) or is left out (`skip`), counted either way."""

    # Where reward_clip_range applies (the kinds' own, kinds/<kind>/config.py): shown in plan.json and the report.
    CLIP_APPLIES_TO: ClassVar[str] = "each reward function's value, before the weights (our reward wrapper)"
    reward_funcs: Annotated[list[str], Field(min_length=1)] = ["accuracy", "format"]
    """Reward functions by name (stages/rewards.py): accuracy (answer matches the record's reference; normalised,
    numeric, Chinese-aware), format (<think>…</think><answer>…</answer>), length (soft penalty beyond
    length_target tokens), reward_model (the rm stage's score; adds rm to `needs`), or a custom function by import
    path "package.module:function" with TRL's signature."""
    reward_weights: list[float] | None = None
    """One weight per reward function (the reward is their weighted sum); null: 1.0 each."""
    num_generations: Annotated[int, Field(ge=2)] = 8
    """Completions sampled per prompt (the group: GRPO's G, RLOO's k)."""
    max_completion_length: Annotated[int, Field(ge=1)] = 256
    """Tokens generated per completion at most."""
    temperature: Annotated[float, Field(gt=0)] = 1.0
    """Sampling temperature of the generations."""
    length_target: Annotated[int, Field(ge=1)] | None = None
    """The `length` reward's free length in tokens; null: half of max_completion_length."""
    compile: Auto | bool = False
    """Compile each decoder layer in place. Off by default here: generation changes the input shape every token."""
    generation_path: GenerationPath = "auto"
    """How the rollouts decode: static (one static KV cache for the run, the decode step compiled by transformers
    with CUDA graphs), dynamic (HF generate's growing cache, eager), or auto: static on a GPU unless QLoRA or ZeRO-3 (a
    Qwen3.5's linear-attention state is held in the static cache in place; on an H100 its 0.8B decoded 4,194 tokens/s
    at 16 sequences there against 557 dynamic), dynamic on the CPU. plan.json's generation_path and `rollout` say
    which and why."""
    reward_model_gpu: bool = False
    """Hold the reward model (the reward_model reward) in one Ray actor of its own, on a GPU of its own that the
    placement picks beside the stage's GPUs (plan.json's reward_model_gpu; a CPU run: a process of its own),
    instead of beside the policy in every training worker: the policy's GPU is planned without it. Needs a GPU on
    the node that the stage's workers do not use."""
    reward_shared_base: Auto | bool = "auto"
    """The reward_model reward as the rm stage's LoRA adapter + score head on this stage's own base (the policy's
    LoRA and the reward adapter on one frozen base, the reference all adapters off: no second network). auto: when
    rm trains with LoRA/QLoRA from the same stage as this one and neither this stage trains in full nor
    reward_model_gpu nor lora.experts (here or in rm: PEFT scores no mixed-adapter batch through them) is on;
    true: the same, refused when that does not hold; false: the rm's merged model."""
    reward_clip_range: Annotated[list[float], Field(min_length=2, max_length=2)] | None = None
    """[min, max]: rewards clipped to this range (e.g. [-5, 5]); null: none (TRL's default). A reward model's scores
    are unbounded, and a policy that finds what it scores high drives them (and the advantages) up without end
    (the seed's field report on 8 x 4090). rloo: TRL's reward_clip_range, the weighted sum of the rewards clipped
    before the KL penalty; grpo (TRL's GRPOTrainer has no such option): each reward function's value clipped in our
    reward wrapper (stages/rewards.py), before the weights. Shown in plan.json (reward_clip) and the report."""
    # The rm stage's LoRA rank, set with reward_shared_base by the pipeline config (config/pipeline.py): the
    # planner sizes the reward adapter at the rank rm trains it with, not at this stage's.
    _rm_lora_rank: int = PrivateAttr(default=0)

    @property
    def reward_lora_rank(self) -> int:
        """The reward adapter's LoRA rank (the rm stage's); 0 until the pipeline config resolves it."""
        return self._rm_lora_rank

    @model_validator(mode="before")
    @classmethod
    def _reward_model_needs_its_stage(cls, data: Any) -> Any:
        # The kind's default reward_funcs count too: rloo's is [reward_model], so it needs the reward-model stage
        # (rm) unless told otherwise.
        if isinstance(data, dict) and "reward_model" in (data.get("reward_funcs")
                                                         or cls.model_fields["reward_funcs"].default):
            needs, rm = list(data.get("needs") or []), reward_model_kind()
            data = {**data, "needs": needs if rm in needs else [*needs, rm]}
        return data

    @model_validator(mode="after")
    def _clip_range_ordered(self) -> OnlineRLStageConfig:
        clip = self.reward_clip_range
        if clip is not None and not (math.isfinite(clip[0]) and math.isfinite(clip[1]) and clip[0] < clip[1]):
            raise ValueError(f"reward_clip_range: {clip} is not [min, max] with finite min < max")
        return self

    @property
    def reward_clip(self) -> dict[str, Any] | None:
        """The clipping as plan.json and the report show it: the range and where it applies (the kind's)."""
        if self.reward_clip_range is None:
            return None
        return {"min": self.reward_clip_range[0], "max": self.reward_clip_range[1], "applied_to": self.CLIP_APPLIES_TO}

    @model_validator(mode="after")
    def _consistent(self) -> OnlineRLStageConfig:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights: {len(self.reward_weights)} weights for {len(self.reward_funcs)} "
                             f"reward function(s) {self.reward_funcs}")
        odd = [r for r in self.reward_funcs if r not in BUILTIN_REWARDS and "." not in r and ":" not in r]
        if odd:
            raise ValueError(f"reward_funcs: {odd[0]!r} is not one of {', '.join(BUILTIN_REWARDS)} nor an import "
                             f"path 'package.module:function'")
        if self.effective_batch % self.num_generations:
            raise ValueError(f"effective_batch: {self.effective_batch} completions per step is not a multiple of "
                             f"num_generations {self.num_generations} (each prompt's group is trained whole)")
        if self.reward_model_gpu and "reward_model" not in self.reward_funcs:
            raise ValueError(f"reward_model_gpu: true places the reward model, and reward_funcs {self.reward_funcs} "
                             f"has no reward_model")
        if self.reward_shared_base is True and (self.reward_model_gpu or "reward_model" not in self.reward_funcs):
            raise ValueError("reward_shared_base: true puts the reward model's adapter beside the policy, and "
                             + ("reward_model_gpu: true holds it in an actor" if self.reward_model_gpu else
                                f"reward_funcs {self.reward_funcs} has no reward_model"))
        if self.max_completion_length >= self.seq_len:
            raise ValueError(f"max_completion_length: {self.max_completion_length} leaves no room for the prompt "
                             f"in seq_len {self.seq_len}")
        return self

    @property
    def free_length(self) -> int:
        return self.length_target or max(self.max_completion_length // 2, 1)

    def shared_base_blocker(self, rm: StageConfig, rm_start: str | None, own_start: str | None) -> str | None:
        """Why the reward model cannot share this stage's base (None: it can): the rm stage's LoRA adapter only
        applies to the model rm started from, only a LoRA policy leaves that base frozen, and PEFT runs no
        mixed-adapter batch through expert adapters (lora.experts, on either side)."""
        if "reward_model" not in self.reward_funcs:
            return f"reward_funcs {self.reward_funcs} has no reward_model"
        if self.reward_model_gpu:
            return "reward_model_gpu: true holds the reward model in an actor of its own"
        if self.method == "full":
            return "this stage trains in full (method: full): no frozen base to share"
        if rm.method == "full":
            return "the rm stage trains in full (method: full): its reward is a merged network"
        if rm.lora.experts or self.lora.experts:  # PEFT 0.21.2: ParamWrapper._check_forward_args raises on it
            return (f"{'the rm stage' if rm.lora.experts else 'this stage'} sets lora.experts: PEFT's expert adapters "
                    f"refuse the mixed-adapter batch that scoring on the shared base runs")
        if rm_start != own_start:
            return (f"the rm stage starts from {rm_start or 'the base model'}, this stage from "
                    f"{own_start or 'the base model'}")
        return None
