"""The eval kind's config (stages.eval): what it measures on the held-out split and how much of it. Sits with
config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by config/__init__ last.

The eval stage trains nothing: it compares the models of a run. Its `from` (default sft) is the reference model of
the win rates; its `needs` (default: every other enabled stage) the models it compares, rm among them as the judge.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from medgpt_ray.config.online_rl import GenerationPath
from medgpt_ray.config.registry import StageKind, register_stage_kind
from medgpt_ray.config.stage import StageConfig


class EvalStageConfig(StageConfig):
    """Held-out loss of every model, generations judged by the reward model, exam accuracy (docs/stages.md: the eval
    stage). The training keys (lr, epochs, ...) are unused; `seq_len` bounds every scored sequence, `method` and
    `precision` decide only how the models are loaded (the planner plans the stage like an SFT LoRA stage: frozen
    weights and one micro-batch of activations, an upper bound of a forward pass and a generation's KV cache)."""

    num_workers: Literal[1] = 1
    """The eval stage runs in one process (one GPU when the run has GPUs)."""
    max_examples: Annotated[int, Field(ge=1)] | None = 256
    """Held-out SFT conversations whose response-only loss (and perplexity) is measured per model (pt: held-out
    pretraining text as well); null: all of them."""
    max_prompts: Annotated[int, Field(ge=1)] = 64
    """Held-out prompts each model answers: the prompt turns of the SFT held-out conversations and data.prompt's
    held-out records (these at most half), the first ones of each split in its hash order."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 128
    """Tokens generated per answer at most (greedy decoding)."""
    batch_size: Annotated[int, Field(ge=1)] = 8
    """Sequences per forward pass and prompts per generate call."""
    bootstrap: Annotated[int, Field(ge=100)] = 1000
    """Resamples of the prompts for the win rate's 95 % interval (seeded by the run's seed)."""
    exam_max_new_tokens: Annotated[int, Field(ge=1)] = 8
    """Tokens generated per exam question for the generated-letter accuracy."""
    loss_model: Literal["response", "all"] = "response"
    """response: the loss of the assistant turns only (as SFT trains); all: every token of the conversation."""
    generation_path: GenerationPath = "auto"
    """How the answers decode: static (one static KV cache per model, the decode step compiled by transformers with
    CUDA graphs: a compilation per model, paid back over many answers), dynamic, or auto: static on a GPU unless the
    model has linear-attention layers (generation/decode_path.py)."""


# Off unless enabled (the shipped tiny configs enable it): compares the run's models on the held-out split; registered
# after the training kinds. Its module is kinds/eval/stage.py (it generates with the Ray-free generation engine).
register_stage_kind(StageKind("eval", EvalStageConfig, "sft", "sft", {"enabled": False}, memory_model="sft",
                              trains=False, reads=("prompt", "exam", "pretrain"), evaluates_run=True))
