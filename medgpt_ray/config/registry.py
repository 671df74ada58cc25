"""The stage-kind registry: what a kind is (its config class, data kind, default `from`, memory model, how it is
judged on preference pairs) and the kinds registered so far (each kinds/<kind>/config.py registers its kind, imported in
pipeline order by config/__init__)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from medgpt_ray.config.base import ConfigError


@dataclass(frozen=True)
class PairAccuracy:
    """How a preference stage kind is judged: its held-out preference accuracy (the share of held-out pairs it
    ranks chosen-first, what run/pair_report.py sets beside the model-free baselines) and what ranks a pair."""

    key: str  # the key in the stage result's `eval` that holds it
    scorer: str  # what ranks a pair, for people (the summary prints it)


# What a kind's length profile measures per training example (stages/length_profile.py, memory/lengths.py): nothing
# (fixed blocks of seq_len), a conversation, a prompt plus the completions generated for it, the longer half of a
# preference pair, or one prompt-completion example.
Measured = Literal["blocks", "conversations", "prompts", "pairs", "completions"]


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
    # The facts run/, tune/, stages/, report/ and cli/ consult instead of comparing kind names (docs/ARCHITECTURE.md,
    # "The stage-kind contract"):
    measures: Measured = "conversations"  # what its length profile measures per example
    produces_reward_model: bool = False  # its output is the run's reward model (the reward_model reward's scorer)
    sequence_classifier: bool = False  # its output model is a sequence classifier (a score head), exported as one
    # It compares the run's models: its `needs` default to every other enabled stage, and its results are the run's
    # evaluation (summary.json, the report, an exported model's card)
    evaluates_run: bool = False
    # Its trainer generates with the policy outside the Trainer's autocast, where peft's fp32 cast of a LoRA
    # adapter's inputs is needed (stages/callbacks.py leaves the bf16 input cast off)
    generates_outside_autocast: bool = False
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


def reward_model_kind() -> str:
    """The kind whose output is the run's reward model: what the reward_model reward needs."""
    found = [k.name for k in STAGE_KINDS.values() if k.produces_reward_model]
    if len(found) != 1:
        raise ConfigError(f"the registry holds {len(found)} reward-model kinds ({', '.join(found) or 'none'}), "
                          f"not one")
    return found[0]


def run_evaluator() -> str | None:
    """The kind that evaluates the run (compares its models); None where none is registered."""
    return next((k.name for k in STAGE_KINDS.values() if k.evaluates_run), None)
