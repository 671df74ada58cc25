"""The roles a conversation turn may have and the errors the templates raise (see the package docstring)."""

from __future__ import annotations

IGNORE_INDEX = -100

ROLES = ("system", "user", "assistant", "tool_call", "tool")

USER_SIDE = ("user", "tool")

ASSISTANT_SIDE = ("assistant", "tool_call")

TOOL_ROLES = ("tool_call", "tool")

class TemplateError(ValueError):
    """A conversation or record does not fit a template (messages never quote record text)."""

class TemplateTokenizerMismatch(TemplateError):
    """The tokenizer splits a template's control token into pieces (or maps it to unk)."""

class TemplateToolsUnsupported(TemplateError):
    """The template has no tool-calling format, but the record has tools or tool turns."""
