"""The whole pipeline config (PipelineConfig): its sections, the checks across them (the stage graph sound, the
eval stage's defaults, the online-RL stages' reward on a shared base), and the queries on the stage graph that
the planner and the runners ask (where a stage starts from, the enabled stages in dependency order)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from medgpt_ray.config.base import _Strict
from medgpt_ray.config.online_rl import OnlineRLStageConfig
from medgpt_ray.config.registry import STAGE_KINDS, reward_model_kind, stage_kind
from medgpt_ray.config.sections import DataConfig, ModelConfig, ResourcesConfig
from medgpt_ray.config.stage import StageConfig
from medgpt_ray.config.stages import StagesConfig


class PipelineConfig(_Strict):
    name: str = "default"
    output_dir: str = "./runs"
    seed: int = 42
    progress_every: Annotated[int, Field(ge=1)] = 10
    # TensorBoard event files under runs/<name>/<stage>/tb/ for every stage (`stages.<kind>.report_to` wins).
    report_to: Literal["none", "tensorboard"] = "tensorboard"
    model: ModelConfig
    data: DataConfig = DataConfig()
    resources: ResourcesConfig = ResourcesConfig()
    # Built when a config is validated, not when this class is defined: every kind registered by then gets its
    # defaults, whichever module registers it (config/__init__.py imports the kinds' config modules).
    stages: StagesConfig = Field(default_factory=StagesConfig)

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, v: str) -> str:
        if not v or "/" in v or v.startswith("."):
            raise ValueError("must be a plain directory name (no '/', not starting with '.')")
        return v

    @model_validator(mode="after")
    def _graph_is_sound(self) -> PipelineConfig:
        for s in self.enabled_stages():  # which also refuses a cycle
            c = self.stages.get(s)
            for ref in [*([c.from_] if c.from_ else []), *c.needs]:
                if ref not in STAGE_KINDS or ref == s:
                    raise ValueError(f"stages.{s}: '{ref}' is not another stage ({', '.join(STAGE_KINDS)})")
            off = [n for n in c.needs if not self.runs(n)]
            if off:
                why = ("trains nothing (max_steps: 0), so it has no output to read" if self.passes_on(off[0])
                       else f"is disabled (stages.{off[0]}.enabled: false)")
                raise ValueError(f"stages.{s}.needs: stage '{off[0]}' {why}")
        return self

    @model_validator(mode="after")
    def _resolved(self) -> PipelineConfig:
        """The config with what its stages leave to be decided filled in: eval's `needs` and the online-RL stages'
        reward_shared_base. A new object: a validated config is frozen (docs/ARCHITECTURE.md)."""
        changed = {**self._eval_needs(), **self._shared_base_resolved()}
        return self.model_copy(update={"stages": self.stages.model_copy(update=changed)}) if changed else self

    def _eval_needs(self) -> dict[str, StageConfig]:
        """An enabled stage that evaluates the run (eval) with no `needs` given compares every other enabled stage's
        model to its `from`."""
        out: dict[str, StageConfig] = {}
        for name in self.stages.kinds():
            ev = self.stages.get(name)
            if not stage_kind(name).evaluates_run or not ev.enabled or ev.needs:
                continue
            start = self.start_of(name)
            others = [s for s in self.enabled_stages() if s not in (name, start)]
            if others:
                out[name] = ev.model_copy(update={"needs": others})
        return out

    def _shared_base_resolved(self) -> dict[str, StageConfig]:
        """An online-RL stage's reward_shared_base resolved (auto -> true or false), or refused when true cannot
        hold (stages/reward_adapter.py: the rm's LoRA adapter on this stage's own base)."""
        out: dict[str, StageConfig] = {}
        rm = reward_model_kind()
        for s in self.enabled_stages():
            c = self.stages.get(s)
            if not isinstance(c, OnlineRLStageConfig) or rm not in c.needs or c.reward_shared_base is False:
                continue
            blocker = c.shared_base_blocker(self.stages.get(rm), self.start_of(rm), self.start_of(s))
            if c.reward_shared_base is True and blocker:
                raise ValueError(f"stages.{s}.reward_shared_base: true, but {blocker}")
            resolved = c.model_copy(update={"reward_shared_base": blocker is None})
            resolved._rm_lora_rank = self.stages.get(rm).lora.rank if blocker is None else 0
            out[s] = resolved
        return out

    def start_of(self, stage: str) -> str | None:
        """The enabled stage whose model `stage` starts from; None: the base model (a disabled stage, or one of
        max_steps 0, hands over its own input; run/dag.effective_from)."""
        c = self.stages.get(stage)
        up = c.from_ if c.from_ is not None else stage_kind(stage).default_from
        while up is not None and not self.runs(up):
            u = self.stages.get(up)
            up = u.from_ if u.from_ is not None else stage_kind(up).default_from
        return up

    def depends_on(self, stage: str) -> list[str]:
        """The stages `stage` starts from or reads, as configured (enabled or not)."""
        c = self.stages.get(stage)
        start = c.from_ if c.from_ is not None else stage_kind(stage).default_from
        return [*([start] if start else []), *c.needs]

    def enabled_stages(self) -> list[str]:
        """The enabled stages that run (not those of max_steps 0), each after the ones it depends on (else in
        registry order)."""
        order: list[str] = []
        visiting: list[str] = []

        def visit(s: str) -> None:
            if s in order:
                return
            if s in visiting:
                raise ValueError(f"stages: {' -> '.join([*visiting[visiting.index(s):], s])} is a cycle "
                                 f"(from/needs)")
            visiting.append(s)
            for d in self.depends_on(s):
                if d in STAGE_KINDS:
                    visit(d)
            visiting.pop()
            order.append(s)

        for s in self.stages.kinds():
            visit(s)
        return [s for s in order if self.runs(s)]

    def passes_on(self, stage: str) -> bool:
        """An enabled training stage of max_steps 0: it trains nothing and hands its input model on, as a disabled
        one does (what bench/rl_stage_run.py --train-steps 0 means; StageConfig.max_steps)."""
        c = self.stages.get(stage)
        return c.enabled and c.max_steps == 0 and stage_kind(stage).trains

    def runs(self, stage: str) -> bool:
        """Whether the stage runs at all: enabled, and not passing its input on (max_steps 0)."""
        return self.stages.get(stage).enabled and not self.passes_on(stage)

    def workers_for(self, stage: str) -> int:
        return self.stages.get(stage).num_workers or self.resources.num_workers

    def template_for(self, stage: str) -> str:
        return self.stages.get(stage).template or self.model.template

    def report_to_for(self, stage: str) -> str:
        return self.stages.get(stage).report_to or self.report_to
