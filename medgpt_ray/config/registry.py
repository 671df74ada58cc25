"""The stage-kind registry: what a kind is (its config class, data kind, default `from`, memory model, how it is
judged on preference pairs) and the kinds registered so far (each kinds/<kind>/config.py registers its kind, imported in
pipeline order by config/__init__)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.config.base import ConfigError


@dataclass(frozen=True)
class PairAccuracy:
    """How a preference stage kind is judged: its held-out preference accuracy (the share of held-out pairs it
    ranks chosen-first, what run/pair_report.py sets beside the model-free baselines) and what ranks a pair."""

    key: str  # the key in the stage result's `eval` that holds it
    scorer: str  # what ranks a pair, for people (the summary prints it)


@dataclass(frozen=True)
class StageKind:
    """A stage kind. A new one is a module (build and run, like medgpt_ray/kinds/sft/stage.py), a config class and
    this registry entry: the config, the stage graph, the planner and the runners take it from here."""

    name: str  # its key under `stages:`, and the stage's name in a run (one stage per kind)
    config_class: type  # its StageConfig subclass (config/stage.py)
    data_kind: str  # the data.<kind> it trains on
    default_from: str | None  # whose model it starts from unless `from` says otherwise; None: the base model
    defaults: dict[str, Any] = field(default_factory=dict)  # the kind's own defaults (pt: full, lr 5e-5)
    module: str | None = None  # None: medgpt_ray.kinds.<name>.stage
    memory_model: str | None = None  # the built-in kind whose memory/throughput model it follows; None: itself
    pair_accuracy: PairAccuracy | None = None  # a kind that ranks preference pairs: where its accuracy is
    # False: the kind trains nothing and has no model of its own (eval): it runs as one Ray task, not a Ray Train run,
    # and its manifest entry points at its results directory
    trains: bool = True
    reads: tuple[str, ...] = ()  # other data kinds it reads when the config gives them (eval: prompt, exam)

    @property
    def module_name(self) -> str:
        return self.module or f"medgpt_ray.kinds.{self.name}.stage"

    @property
    def memory_kind(self) -> str:
        return self.memory_model or self.name


STAGE_KINDS: dict[str, StageKind] = {}  # in pipeline order, when `from` and `needs` leave it so


def register_stage_kind(kind: StageKind) -> StageKind:
    STAGE_KINDS[kind.name] = kind
    return kind


def stage_kind(name: str) -> StageKind:
    if name not in STAGE_KINDS:
        raise ConfigError(f"stage '{name}' is not one of {', '.join(STAGE_KINDS)}")
    return STAGE_KINDS[name]
