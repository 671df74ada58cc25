"""The top-level sections of a pipeline config besides `stages:` (model, data, resources): what each key means
and the checks that need only its own section."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from medgpt_ray.config.base import _Strict
from medgpt_ray.config.clean import CleanConfig


class ModelConfig(_Strict):
    # A local Hugging Face checkpoint directory, or the preset "tiny". Never a hub id.
    path: str
    # The chat template (medgpt_ray.templates.template_names(); an unknown name fails when a stage opens its data,
    # listing them). "auto": the tokenizer's own chat template where it ships one, trained through its
    # {% generation %} markers (TRL's training variant where the shipped one has none), else chatml. Named:
    # chatml (= qwen), llama3, vicuna, alpaca (ours, segment by segment); qwen3, qwen3_5 (thinking on for records
    # whose assistant turns carry reasoning_content, else off), qwen3_nothink, qwen3_5_nothink (always off),
    # glm4, mistral (the family's template, whatever the tokenizer ships).
    template: str = "auto"
    # The architecture to plan memory for when model.path is not readable where the plan is made (planning a
    # cluster config on a laptop): a preset of medgpt_ray.memory.shapes. model.path's config.json wins.
    shape: str | None = None


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

    @field_validator("*", mode="before")
    @classmethod
    def _one_path_is_a_list_of_one(cls, value: object, info: ValidationInfo) -> object:
        # `<kind>: data/x.jsonl` (a path, not a list) is what a user writes for one file: the list of it.
        paths = cls.model_fields[info.field_name].annotation == list[str]
        return [value] if paths and isinstance(value, str) else value

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

