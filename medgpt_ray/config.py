"""The one configuration model of the pipeline: YAML in, typed objects out.

Unknown keys are errors (a typo must not silently fall back to a default), and
every error names the file (or `--set`) and the dotted key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

STAGES: tuple[str, ...] = ("pt", "sft", "rm", "dpo")
# The DAG of ARCHITECTURE.md: rm and dpo both start from the merged SFT model.
UPSTREAM: dict[str, str | None] = {"pt": None, "sft": "pt", "rm": "sft", "dpo": "sft"}
DATA_KIND: dict[str, str] = {"pt": "pretrain", "sft": "sft", "rm": "preference", "dpo": "preference"}

Auto = Literal["auto"]


class ConfigError(ValueError):
    """A configuration problem; the message names the source and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Strict):
    rank: Annotated[int, Field(ge=1)] = 8
    alpha: Annotated[float, Field(gt=0)] = 16
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    # "all-linear" is PEFT's own selector: every linear layer except the output head.
    targets: str | list[str] = "all-linear"


class StageConfig(_Strict):
    enabled: bool = True
    method: Literal["auto", "full", "lora", "qlora"] = "auto"
    lora: LoraConfig = LoraConfig()
    precision: Literal["auto", "fp32", "bf16", "amp-bf16"] = "auto"
    lr: Annotated[float, Field(gt=0)] = 2e-5
    epochs: Annotated[float, Field(gt=0)] = 1.0
    max_steps: Annotated[int, Field(ge=-1)] = -1  # -1: run `epochs`
    seq_len: Annotated[int, Field(ge=8)] = 1024
    micro_batch: Auto | Annotated[int, Field(ge=1)] = "auto"
    effective_batch: Annotated[int, Field(ge=1)] = 16  # global: micro x accumulation x workers
    # true: every decoder layer recomputes its activations; false: none; a fraction in (0, 1): that share
    # of the layers (selective checkpointing, the first ones).
    grad_ckpt: Auto | bool | Annotated[float, Field(gt=0, lt=1)] = "auto"
    # Fused linear cross-entropy (no b x s x vocab logits). pt: Liger's kernel (GPU, gpu extra);
    # sft and dpo: TRL's chunked LM head, always on; rm has no vocabulary head.
    fused_ce: Auto | bool = "auto"
    # Fused RMSNorm, SwiGLU and RoPE (GPU): fewer, leaner ops, less activation memory. pt, sft and dpo (causal
    # LMs). Provided by the compiled layers when `compile` is on, else by Liger's Triton kernels (gpu extra).
    fused_kernels: Auto | bool = "auto"
    # Compile each decoder layer in place with torch.compile (inductor fuses the norms, SwiGLU, RoPE and LoRA's
    # small ops; it then provides the fused layer ops instead of Liger). auto: on GPU, except QLoRA, ZeRO-3 and
    # stages capped below 50 steps (compiling costs each worker 20-60 s).
    compile: Auto | bool = "auto"
    optim: Literal["auto", "adamw", "adamw-8bit"] = "auto"
    zero_stage: Auto | Literal[0, 1, 2, 3] = "auto"
    offload: Literal["auto", "none", "optimizer", "all"] = "auto"
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.03
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    save_steps: Annotated[int, Field(ge=1)] = 200
    eval_steps: Annotated[int, Field(ge=1)] | None = None  # None: evaluate once at the end
    logging_steps: Annotated[int, Field(ge=1)] = 10
    template: str | None = None  # None: model.template
    num_workers: Annotated[int, Field(ge=1)] | None = None  # None: resources.num_workers
    # GPUs by PCIe topology (medgpt_ray/placement/policy.py), or an explicit list of GPU indices on each node
    # (PCI bus order, as nvidia-smi numbers them), checked against the node's topology.
    placement: Literal["auto"] | list[Annotated[int, Field(ge=0)]] = "auto"


    def training_identity(self) -> dict[str, Any]:
        """The config as a stage fingerprint sees it: what decides the updates the stage computes.

        Left out: `enabled`, and the memory and placement knobs, explicit or `auto` (ARCHITECTURE.md): the
        micro-batch/accumulation split, checkpointing, fused CE and layer kernels, compiling, ZeRO, offload and
        the GPUs it runs on compute the same updates in another memory layout. The knobs the planner resolves
        that do change the updates (method, precision, optimizer, per-worker batch) enter the fingerprint as
        the plan resolved them (StagePlan.identity), so `auto` and its explicit resolution hash the same."""
        return self.model_dump(mode="json", exclude={"enabled", *MEMORY_KNOBS, *PLAN_RESOLVED_KNOBS})


# Planner knobs that change only how the same updates are laid out in memory, and where they run.
MEMORY_KNOBS: frozenset[str] = frozenset(
    {"micro_batch", "grad_ckpt", "fused_ce", "fused_kernels", "compile", "zero_stage", "offload", "placement"})
# Planner knobs that change the updates: in a fingerprint through StagePlan.identity(), resolved.
PLAN_RESOLVED_KNOBS: frozenset[str] = frozenset({"method", "precision", "optim"})


class DPOStageConfig(StageConfig):
    beta: Annotated[float, Field(gt=0)] = 0.1
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust"] = "sigmoid"
    # Score the reference once before training instead of a no-grad reference pass every step.
    precompute_ref_log_probs: bool = False


class StagesConfig(_Strict):
    pt: StageConfig = StageConfig(method="full", lr=5e-5)
    sft: StageConfig = StageConfig()
    rm: StageConfig = StageConfig(lr=1e-5)
    dpo: DPOStageConfig = DPOStageConfig(lr=5e-6)

    def get(self, stage: str) -> StageConfig:
        return getattr(self, stage)


class ModelConfig(_Strict):
    # A local Hugging Face checkpoint directory, or the preset "tiny". Never a hub id.
    path: str
    template: str = "chatml"
    # The architecture to plan memory for when model.path is not readable where the plan is made (planning a
    # cluster config on a laptop): a preset of medgpt_ray.memory.shapes. model.path's config.json wins.
    shape: str | None = None


class NormalizeConfig(_Strict):
    enabled: bool = True
    fullwidth_to_halfwidth: bool = True  # ASCII letters/digits/space only; Chinese punctuation stays
    collapse_whitespace: bool = True
    traditional_to_simplified: bool = False  # OpenCC t2s


class PIIConfig(_Strict):
    enabled: bool = True
    types: list[Literal["id_card", "phone", "email", "bank_card"]] = ["id_card", "phone", "email", "bank_card"]


class SignoffConfig(_Strict):
    enabled: bool = True
    # Stock closing phrases stripped from the end of responses (regular expressions, Python `re`).
    phrases: list[str] = [
        r"感谢您?的?(咨询|信任|提问|使用)[^。！!]*[。！!]?",
        r"祝您?(身体)?(健康|早日康复|生活愉快)[^。！!]*[。！!]?",
        r"如有(其他|任何)?(疑问|问题)[^。！!]*[。！!]?",
        r"希望(我的回答|以上回答|以上内容)?(对您)?有(所)?帮助[^。！!]*[。！!]?",
        r"(以上(建议|内容|回答))?仅供参考[^。！!]*[。！!]?",
    ]


class QualityConfig(_Strict):
    enabled: bool = True
    min_chars: Annotated[int, Field(ge=0)] = 2  # per field (text, system/user turns, rejected) except responses
    max_chars: Annotated[int, Field(ge=1)] = 20000  # every field (tool_call/tool turns and a prompt's answer too)
    # Responses (assistant turns, chosen): 1, because a one-term answer (肝, CT, 0.5g) is a full answer in medical
    # QA; short filler is caught by content (data/ops/quality.py), not by length.
    min_response_chars: Annotated[int, Field(ge=0)] = 1
    # Low-information answers: Shannon entropy (bits) of the jieba tokens of a response (field report: 1.5),
    # used for filler (below: low_entropy, else non_answer) and for responses of at least min_entropy_tokens
    # content tokens; shorter responses are not judged by entropy (a 1-2 token answer scores 0-1 bit whatever
    # it says: 阿奇霉素, 肿瘤科；肿瘤外科).
    min_response_entropy_bits: Annotated[float, Field(ge=0)] = 1.5
    min_entropy_tokens: Annotated[int, Field(ge=1)] = 8  # jieba content tokens before entropy judges a response
    max_char_repetition: Annotated[float, Field(gt=0, le=1)] = 0.5  # share of the most frequent char 3-gram
    # Special characters: not CJK, not letters/digits, not common punctuation or unit symbols (mg, ℃, %, /, ±…),
    # so dosage- and lab-heavy clinical text is kept.
    max_special_char_ratio: Annotated[float, Field(ge=0, le=1)] = 0.3


class DedupConfig(_Strict):
    exact: bool = True
    near: bool = True
    ngram: Annotated[int, Field(ge=1)] = 5  # character n-grams
    num_perm: Annotated[int, Field(ge=8)] = 128
    bands: Annotated[int, Field(ge=1)] = 16  # rows per band = num_perm / bands
    threshold: Annotated[float, Field(gt=0, le=1)] = 0.8  # reported Jaccard estimate for a near duplicate
    seed: int = 1


class CleanConfig(_Strict):
    normalize: NormalizeConfig = NormalizeConfig()
    pii: PIIConfig = PIIConfig()
    signoff: SignoffConfig = SignoffConfig()
    quality: QualityConfig = QualityConfig()
    dedup: DedupConfig = DedupConfig()
    # Ray Data: rows per block and per map batch, and CPUs per cleaning task. One task per core: the cleaner uses
    # tasks, not actor pools, and 0.5 (two per core) measured 12 % slower on one core with twice the memory
    # (bench/README.md).
    batch_size: Annotated[int, Field(ge=1)] = 1024
    num_cpus_per_task: Annotated[float, Field(gt=0)] = 1.0


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
    # Prompt records (MedicalGPT's GRPO {"question", "answer"}, or prompt turns + a reference answer): read,
    # cleaned and split now; the RL and eval stages that train on them come later.
    prompt: list[str] = []
    # Raw sources to clean first (kind detected per file); their cleaned Parquet joins the lists above.
    raw: list[str] = []
    clean: CleanConfig = CleanConfig()
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    max_records: Annotated[int, Field(ge=1)] | None = None  # per kind, after the split; for smoke runs

    def paths(self, kind: str) -> list[str]:
        return getattr(self, kind)


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

    def enabled_stages(self) -> list[str]:
        return [s for s in STAGES if self.stages.get(s).enabled]

    def workers_for(self, stage: str) -> int:
        return self.stages.get(stage).num_workers or self.resources.num_workers

    def template_for(self, stage: str) -> str:
        return self.stages.get(stage).template or self.model.template


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
        else:
            lines.append(f"{source}: {key}: {e['msg']}")
    return "\n".join(lines)


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML so numbers and bools keep their type)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE with a dotted KEY")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    return parts, yaml.safe_load(raw) if raw.strip() else ""


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
    return cfg.model_dump(mode="json")
