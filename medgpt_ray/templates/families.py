"""Chat templates rendered by Jinja through the tokenizer (``apply_chat_template``), not by our segment records: the
model families MedicalGPT names (qwen3, qwen3_5, glm4, mistral, with or without thinking) and ``auto``, the
tokenizer's own template.

Each has the template a model ships (``jinja``: what a trained model's tokenizer keeps, what users chat with) and its
training variant (``training``: the same rendering with ``{% generation %}`` markers around what the model writes,
earlier turns rendered the same whatever follows them). The Qwen ones are TRL's (trl/chat_templates: the originals
and TRL's ``*_training`` variants); TRL bundles none for GLM-4 dense and Mistral, so ours are committed in
templates/fixtures/ (package data: tests and runs stay offline).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# What decides Qwen3's `enable_thinking` for a record: "per_record" = on when an assistant turn carries reasoning
# (`reasoning_content`, or `<think>...</think>` in its content), off otherwise (the empty `<think></think>` block
# Qwen3 renders for non-thinking answers); "off" = never, reasoning is dropped (the `*_nothink` names).
PER_RECORD = "per_record"
OFF = "off"


@dataclass(frozen=True)
class JinjaTemplate:
    name: str
    jinja: str  # the template as the model ships it (saved with a trained model)
    training: str  # the same rendering with {% generation %} markers: masks, prompts and responses use it
    thinking: str = PER_RECORD


@dataclass(frozen=True)
class AutoTemplate:
    """The tokenizer's own chat template where it ships one, else chatml (templates/resolve.py decides per
    tokenizer)."""

    name: str = "auto"


AUTO = AutoTemplate()


def _trl(name: str) -> str:
    """A template TRL bundles, read from its package directory (found without importing trl: generation needs
    none of it)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("trl is not installed: its chat templates are needed for the Qwen3/3.5 names")
    root = Path(next(iter(spec.submodule_search_locations)))
    return (root / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _ours(name: str) -> str:
    return (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")


def _family(name: str, source: str, read, thinking: str = PER_RECORD) -> JinjaTemplate:
    return JinjaTemplate(name, read(source), read(f"{source}_training"), thinking)


_FAMILIES: dict[str, JinjaTemplate] | None = None


def families() -> dict[str, JinjaTemplate]:
    """MedicalGPT's names for the Jinja families (read once, on first use: importing the package reads no file)."""
    global _FAMILIES
    if _FAMILIES is None:
        _FAMILIES = {
            "qwen3": _family("qwen3", "qwen3", _trl),
            "qwen3_nothink": _family("qwen3_nothink", "qwen3", _trl, OFF),
            # Qwen3.5's two shipped flavours differ only in enable_thinking's default, which we always pass.
            "qwen3_5": _family("qwen3_5", "qwen3_5_think", _trl),
            "qwen3_5_nothink": _family("qwen3_5_nothink", "qwen3_5_nothink", _trl, OFF),
            "glm4": _family("glm4", "glm4", _ours),
            "mistral": _family("mistral", "mistral", _ours),
        }
    return _FAMILIES


FAMILY_NAMES = ("qwen3", "qwen3_nothink", "qwen3_5", "qwen3_5_nothink", "glm4", "mistral")
