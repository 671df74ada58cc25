"""What ``auto`` means for one tokenizer: its own chat template where it ships one, else chatml (the default before
there was ``auto``, and what every tokenizer without a template still gets).

The tokenizer's template is matched, in order, against: our segment templates' Jinja (a tokenizer a run saved
with chatml/llama3/vicuna/alpaca: the same segment encoder as naming it, so the tiny pipeline's ids are unchanged),
our families' shipped and training texts (glm4, mistral; Qwen's from TRL), and otherwise handed to TRL's
``get_training_chat_template``: the template itself when it already has {% generation %} markers and keeps earlier
turns' rendering, TRL's training variant when TRL bundles one (Qwen2.5/3/3.5, Llama 3, GLM-4.5, Gemma, Phi-3, ...),
an error naming the accepted names when neither (a template without markers would train nothing).
"""

from __future__ import annotations

import weakref
from typing import Any

from medgpt_ray.templates.base import TemplateTokenizerMismatch
from medgpt_ray.templates.catalog import TEMPLATES, ChatTemplate, template_names
from medgpt_ray.templates.families import AutoTemplate, JinjaTemplate, families

# Per tokenizer: the template text it was resolved for, and what that resolved to (re-resolved when a stage writes
# another template into the tokenizer).
_RESOLVED: weakref.WeakKeyDictionary[Any, tuple[str | None, ChatTemplate | JinjaTemplate]] = (
    weakref.WeakKeyDictionary()
)


def own_template(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (a template shipped as named variants: its `default`)."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default")
    return own or None


def resolve(template: ChatTemplate | JinjaTemplate | AutoTemplate, tokenizer: Any) -> ChatTemplate | JinjaTemplate:
    """The template a named one is (itself), or what ``auto`` is for this tokenizer (cached per tokenizer)."""
    if not isinstance(template, AutoTemplate):
        return template
    own = own_template(tokenizer)
    cached = _RESOLVED.get(tokenizer)
    if cached is not None and cached[0] == own:
        return cached[1]
    resolved = _resolve_auto(tokenizer, own)
    _RESOLVED[tokenizer] = (own, resolved)
    return resolved


def _resolve_auto(tokenizer: Any, own: str | None) -> ChatTemplate | JinjaTemplate:
    if own is None:
        return TEMPLATES["chatml"]
    for segment in TEMPLATES.values():
        if segment.jinja == own:
            return segment
    for family in families().values():
        if own in (family.jinja, family.training):
            return JinjaTemplate("auto", family.jinja, family.training)
    from trl.chat_template_utils import get_training_chat_template

    try:
        training = get_training_chat_template(tokenizer)
    except ValueError:
        raise TemplateTokenizerMismatch(  # a property of the tokenizer: every record would fail the same way
            "template 'auto': the tokenizer's chat template has no {% generation %} markers (or re-renders "
            "earlier turns) and TRL has no training variant of it, so no response-only mask can be made; set "
            f"model.template to one of: {', '.join(template_names())}"
        ) from None
    return JinjaTemplate("auto", own, training or own)
