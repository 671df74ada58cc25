"""The one configuration model of the pipeline: YAML in, typed objects out.

Unknown keys are errors (a typo must not silently fall back to a default), and
every error names the file (or `--set`) and the dotted key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from medgpt_ray.config.base import ConfigError, _format_validation_error, _Strict
from medgpt_ray.config.clean import (
    CleanConfig,
    DedupConfig,
    NormalizeConfig,
    PIIConfig,
    QualityConfig,
    SignoffConfig,
)
from medgpt_ray.config.eval import EvalStageConfig
from medgpt_ray.config.online_rl import GRPOStageConfig, OnlineRLStageConfig, RLOOStageConfig
from medgpt_ray.config.registry import STAGE_KINDS, PairAccuracy, StageKind, register_stage_kind, stage_kind
from medgpt_ray.config.stages import (
    MEMORY_KNOBS,
    PLAN_RESOLVED_KNOBS,
    DPOStageConfig,
    KTOStageConfig,
    LengthGroupedStageConfig,
    LoraConfig,
    ORPOStageConfig,
    RMStageConfig,
    SFTStageConfig,
    SimPOStageConfig,
    StageConfig,
    StagesConfig,
)
from medgpt_ray.kinds.opd import config as _opd  # noqa: F401  (registers the opd kind: kinds/opd/config.py)

__all__ = ["MEMORY_KNOBS", "PLAN_RESOLVED_KNOBS", "STAGE_KINDS", "CleanConfig", "ConfigError", "DPOStageConfig",
           "DataConfig", "DedupConfig", "EvalStageConfig", "GRPOStageConfig", "KTOStageConfig",
           "LengthGroupedStageConfig", "LoraConfig", "ModelConfig", "NormalizeConfig", "ORPOStageConfig",
           "OnlineRLStageConfig", "PIIConfig", "PairAccuracy", "PipelineConfig", "QualityConfig", "RLOOStageConfig",
           "RMStageConfig", "ResourcesConfig", "SFTStageConfig",
           "SignoffConfig", "SimPOStageConfig", "StageConfig", "StageKind", "StagesConfig", "apply_override",
           "load_clean_config", "load_config", "parse_set", "register_stage_kind", "resolved_dict", "stage_kind"]

# eval, off unless enabled (the shipped tiny configs enable it): compares the run's models on the held-out split
# (config/eval.py); registered here, after the training kinds (config/stages.py, then config/online_rl.py). Its
# module is in run/: it generates with infer/, which stages/ may not import.
register_stage_kind(StageKind("eval", EvalStageConfig, "sft", "sft", {"enabled": False},
                              module="medgpt_ray.run.eval_stage", memory_model="sft", trains=False,
                              reads=("prompt", "exam", "pretrain")))


class ModelConfig(_Strict):
    # A local Hugging Face checkpoint directory, or the preset "tiny". Never a hub id.
    path: str
    template: str = "chatml"
    # The architecture to plan memory for when model.path is not readable where the plan is made (planning a
    # cluster config on a laptop): a preset of medgpt_ray.memory.shapes. model.path's config.json wins.
    shape: str | None = None


def load_clean_config(path: str | Path | None, sets: list[str] | None = None) -> CleanConfig:
    tree: dict[str, Any] = _read_yaml(Path(path)) if path else {}
    for s in sets or []:
        parts, value = parse_set(s)
        apply_override(tree, parts, value, f"--set {s}")
    try:
        return CleanConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, str(path or "--set"))) from None


class DataConfig(_Strict):
    pretrain: list[str] = []
    sft: list[str] = []
    preference: list[str] = []
    # Prompt records (MedicalGPT's GRPO {"question", "answer"}, or prompt turns + a reference answer): what the
    # grpo stage samples completions for and scores against the reference answer.
    prompt: list[str] = []
    # Unpaired examples for KTO: prompt turns + one completion + a label (true: desirable, false: undesirable), as
    # {"conversations", "completion", "label"} (ShareGPT or role/content turns) or TRL's {"prompt", "completion",
    # "label"}. A kto stage also reads data.preference, each pair as two examples (chosen true, rejected false).
    unpaired: list[str] = []
    # Multiple-choice exam questions for the eval stage: {"question", "options": {"A": ...} or a list, "answer": "A"
    # or "AC"} (CMExam-style) or C-Eval's columns {"question", "A", "B", "C", "D", "answer"}; read as they are (not
    # cleaned, not trained on): every record is asked, the split only keeps ids stable.
    exam: list[str] = []
    # Raw sources to clean first (kind detected per file); their cleaned Parquet joins the lists above.
    raw: list[str] = []
    clean: CleanConfig = CleanConfig()
    # PII redaction (clean.pii.types: ID cards, phones, e-mails, bank cards) of every record on its way into
    # training: the files given per kind above and the cleaned data.raw alike. false is the explicit, logged
    # opt-out: records are trained as given, and the cleaning of data.raw skips its PII step too.
    redact_pii: bool = True
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    max_records: Annotated[int, Field(ge=1)] | None = None  # per kind, after the split; for smoke runs

    @model_validator(mode="after")
    def _one_pii_switch(self) -> DataConfig:
        # clean.pii.enabled alone would switch off only the cleaner's step while the preparation still redacts
        # (or, read the other way, silently stop redaction): the opt-out is redact_pii, said once.
        if self.redact_pii and not (self.clean.pii.enabled and self.clean.pii.types):
            raise ValueError("data.clean.pii turns PII redaction off (enabled: false or no types); to train on "
                             "records as given, set data.redact_pii: false instead")
        return self

    def paths(self, kind: str) -> list[str]:
        return getattr(self, kind)

    def pii_types(self) -> list[str]:
        """The PII types redacted on the way into training; empty when data.redact_pii is false."""
        return list(self.clean.pii.types) if self.redact_pii else []

    def clean_config(self) -> CleanConfig:
        """The cleaner's options for data.raw: data.clean, with its PII step off when data.redact_pii is."""
        if self.redact_pii:
            return self.clean
        return self.clean.model_copy(update={"pii": self.clean.pii.model_copy(update={"enabled": False})})


class ResourcesConfig(_Strict):
    num_workers: Annotated[int, Field(ge=1)] = 1
    use_gpu: bool = False
    cpus_per_worker: Annotated[float, Field(gt=0)] = 1
    # Ray Train's storage; must be shared by all nodes on a multi-node cluster.
    storage_path: str | None = None
    # The planner's per-GPU budget: null reads the device (free memory, less the CUDA context);
    # a number plans for that card (e.g. 24 for an RTX 4090) wherever the plan is made.
    gpu_memory_gib: Annotated[float, Field(gt=0)] | None = None
    # Available RAM of each GPU node and its GPU count, for the planner's CPU-offload check (80 % of it may go
    # to offloaded optimizer states/parameters). None: read on a GPU node; unchecked when none can be read.
    host_memory_gib: Annotated[float, Field(gt=0)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1)] | None = None
    memory_margin_gib: Annotated[float, Field(ge=0)] = 2.0
    # For absolute throughput predictions: a name from medgpt_ray.memory.throughput.GPU_SPECS, or auto.
    gpu_type: str = "auto"
    # Halve the micro-batch and resume when a stage hits CUDA OOM (same effective batch).
    oom_backoff: bool = True
    # Restart a stage from its newest checkpoint when a training worker's process dies (killed, crashed, the host's
    # OOM killer), at most this many times per stage; 0: such a death fails the stage. Exceptions raised by the
    # training code are not retried (they would fail again), nor CUDA OOM (oom_backoff's job).
    worker_restarts: Annotated[int, Field(ge=0)] = 2
    # The GPU nodes' `nvidia-smi topo -m` (a file, or a name in cluster/topologies/); null reads a GPU node.
    # Multi-node stages assume every node has this shape.
    topology_file: str | None = None
    # NCCL/CUDA variables for the workers; they win over the presets derived from the topology.
    nccl_env: dict[str, str] = {}


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
    stages: StagesConfig = StagesConfig()

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, v: str) -> str:
        if not v or "/" in v or v.startswith("."):
            raise ValueError("must be a plain directory name (no '/', not starting with '.')")
        return v

    @model_validator(mode="after")
    def _eval_compares_every_model(self) -> PipelineConfig:
        """An enabled eval stage with no `needs` given compares every other enabled stage's model to its `from`."""
        ev = self.stages.get("eval") if "eval" in self.stages.kinds() else None
        if ev is not None and ev.enabled and not ev.needs:
            start = self.start_of("eval")
            others = [s for s in self.enabled_stages() if s not in ("eval", start)]
            if others:
                ev.needs = others
        return self

    @model_validator(mode="after")
    def _graph_is_sound(self) -> PipelineConfig:
        for s in self.enabled_stages():  # which also refuses a cycle
            c = self.stages.get(s)
            for ref in [*([c.from_] if c.from_ else []), *c.needs]:
                if ref not in STAGE_KINDS or ref == s:
                    raise ValueError(f"stages.{s}: '{ref}' is not another stage ({', '.join(STAGE_KINDS)})")
            off = [n for n in c.needs if not self.stages.get(n).enabled]
            if off:
                raise ValueError(f"stages.{s}.needs: stage '{off[0]}' is disabled (stages.{off[0]}.enabled: false)")
        return self

    @model_validator(mode="after")
    def _reward_shares_the_base(self) -> PipelineConfig:
        """An online-RL stage's reward_shared_base resolved (auto -> true or false), or refused when true cannot
        hold (stages/reward_adapter.py: the rm's LoRA adapter on this stage's own base)."""
        for s in self.enabled_stages():
            c = self.stages.get(s)
            if not isinstance(c, OnlineRLStageConfig) or "rm" not in c.needs or c.reward_shared_base is False:
                continue
            blocker = c.shared_base_blocker(self.stages.get("rm"), self.start_of("rm"), self.start_of(s))
            if c.reward_shared_base is True and blocker:
                raise ValueError(f"stages.{s}.reward_shared_base: true, but {blocker}")
            c.reward_shared_base = blocker is None
            c._rm_lora_rank = self.stages.get("rm").lora.rank if c.reward_shared_base else 0
        return self

    def start_of(self, stage: str) -> str | None:
        """The enabled stage whose model `stage` starts from; None: the base model (a disabled stage hands over
        its own input; run/dag.effective_from)."""
        c = self.stages.get(stage)
        up = c.from_ if c.from_ is not None else stage_kind(stage).default_from
        while up is not None and not self.stages.get(up).enabled:
            u = self.stages.get(up)
            up = u.from_ if u.from_ is not None else stage_kind(up).default_from
        return up

    def depends_on(self, stage: str) -> list[str]:
        """The stages `stage` starts from or reads, as configured (enabled or not)."""
        c = self.stages.get(stage)
        start = c.from_ if c.from_ is not None else stage_kind(stage).default_from
        return [*([start] if start else []), *c.needs]

    def enabled_stages(self) -> list[str]:
        """The enabled stages, each after the ones it depends on (else in registry order)."""
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
        return [s for s in order if self.stages.get(s).enabled]

    def workers_for(self, stage: str) -> int:
        return self.stages.get(stage).num_workers or self.resources.num_workers

    def template_for(self, stage: str) -> str:
        return self.stages.get(stage).template or self.model.template

    def report_to_for(self, stage: str) -> str:
        return self.stages.get(stage).report_to or self.report_to


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML so numbers and bools keep their type)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE with a dotted KEY")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    if not raw.strip():
        return parts, ""
    try:
        return parts, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({problem}); quote it if it is "
                          "meant as a string") from None


def apply_override(tree: dict[str, Any], parts: list[str], value: Any, source: str) -> None:
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{'.'.join(parts[: i + 1])}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}); a config is YAML text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return tree


def load_config(
    path: str | Path, sets: list[str] | None = None, overrides_file: str | Path | None = None
) -> PipelineConfig:
    """Load YAML, then `--overrides FILE` (dotted keys), then each `--set`, then validate once."""
    path = Path(path)
    tree = copy.deepcopy(_read_yaml(path))
    sources = [str(path)]
    if overrides_file is not None:
        ov = _read_yaml(Path(overrides_file))
        for key, value in ov.items():
            apply_override(tree, str(key).split("."), value, str(overrides_file))
        sources.append(str(overrides_file))
    for s in sets or []:
        parts, value = parse_set(s)
        apply_override(tree, parts, value, f"--set {s}")
    if sets:
        sources.append("--set")
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, " + ".join(sources))) from None


def resolved_dict(cfg: PipelineConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", by_alias=True)  # `from`, as the YAML says it
