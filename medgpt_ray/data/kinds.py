"""The data kinds, defined once: each kind's canonical record (ARCHITECTURE.md), the source formats read as it,
and how one record's format is detected. Each stage kind names the kind it trains on (config.STAGE_KINDS); the data
config has one list of paths per kind.
"""

from __future__ import annotations

import re
from typing import Literal

Kind = Literal["pretrain", "sft", "preference", "prompt", "unpaired", "exam"]

KIND_FORMATS: dict[str, tuple[str, ...]] = {
    "pretrain": ("text",),
    "sft": ("sharegpt", "canonical_sft", "alpaca", "huatuo", "toyhom"),
    "preference": ("reward", "sharegpt_preference", "canonical_preference"),
    "prompt": ("grpo", "sharegpt_prompt", "canonical_prompt"),
    "unpaired": ("trl_unpaired", "sharegpt_unpaired", "canonical_unpaired"),
    "exam": ("exam", "ceval", "cmb"),
}
KINDS: tuple[str, ...] = tuple(KIND_FORMATS)
# Multiple-choice exams (data.exam) are read as they are, for the eval stage: the cleaner (data.raw) takes the others.
CLEANED_KINDS: tuple[str, ...] = tuple(k for k in KINDS if k != "exam")
# Kinds whose records are also read as another kind: a preference pair is two unpaired examples (chosen desirable,
# rejected undesirable), as TRL's KTO unpairs them. The pipeline gives a kind's preparation these kinds' files too.
ALSO_READ_AS: dict[str, tuple[str, ...]] = {"unpaired": ("preference",)}


def source_kinds(kind: str) -> tuple[str, ...]:
    """The data.<kind> lists whose files are read as `kind` data: its own, then the ones ALSO_READ_AS names."""
    return (kind, *ALSO_READ_AS.get(kind, ()))


class RecordError(ValueError):
    """Why a single source record cannot be used. The message is the reason only, never record text.

    `raw` carries the original line for records that could not even be parsed, so that the caller can
    keep it in an owner-only quarantine file; it is never part of the message.
    """

    def __init__(self, reason: str, raw: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class DataFileError(ValueError):
    """A problem with a whole file (missing, unreadable, wrong type); the message names the file."""



# --------------------------------------------------------------------------------------------------
# Format detection
# --------------------------------------------------------------------------------------------------


# Chinese role words records use (a role is no free text, but an unknown one might be a name): shown as they are.
ROLE_WORDS = {"用户", "医生", "患者", "病人", "助手", "系统", "人类", "机器人", "咨询者", "提问者", "回答者",
              "客服", "护士"}


def safe_name(value: object) -> str:
    """A role or field name fit to appear in an error message: short identifiers and known role words only, never
    free text (another string is described by its length: it might be a name)."""
    if isinstance(value, str) and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}", value) or value in ROLE_WORDS):
        return repr(value)
    if isinstance(value, str):
        return f"<a string of {len(value)} characters>"
    return f"<{type(value).__name__} value>"


def _conversation_style(conv: object) -> str:
    """"sharegpt" (from/value turns) or "canonical" (role/content turns), judged by the first turn."""
    if not isinstance(conv, list):
        raise RecordError(f"'conversations' is a {type(conv).__name__}, not a list")
    if not conv:
        raise RecordError("'conversations' is empty")
    first = conv[0]
    if not isinstance(first, dict):
        raise RecordError("turn 1 is not an object")
    if "from" in first or "value" in first:
        return "sharegpt"
    if "role" in first or "content" in first:
        return "canonical"
    raise RecordError("conversation turns have neither from/value nor role/content fields")


def detect_format(row: dict) -> str:
    """Name the source format of one record (see the module docstring); RecordError if none fits.

    Detection looks at the distinguishing field of each format, not at the full set, so that a record
    missing a required field is reported as "missing field X" by `to_canonical` rather than as unknown:

    - "conversations": with "chosen" or "rejected" a preference, else with "completion" or "label" an unpaired
      example, else with "answer" a prompt, else sft; the turn style (from/value or role/content) of the first
      turn picks sharegpt_* or canonical_*. A preference, unpaired or prompt record whose turns are unreadable
      counts as canonical_*, whose converter then says why.
    - "options" exam (question/options/answer); "option" (singular) with "question", or any of CMB's
      exam_type/exam_class/exam_subject, cmb (CMB's exam records); "question" with "A" and "B" ceval (C-Eval's
      option columns).
    - otherwise, first match: "response_chosen"/"response_rejected" reward, "completion"/"label" trl_unpaired
      (TRL's KTO {"prompt", "completion", "label"}), "questions" huatuo, "instruction" alpaca, "ask" toyhom,
      "question" grpo, "text" text, a single string field text.
    """
    if not isinstance(row, dict):
        raise RecordError(f"record is a {type(row).__name__}, not an object")
    keys = set(row)
    if "conversations" in keys:
        if keys & {"chosen", "rejected", "completion", "label", "answer"}:
            suffix = ("preference" if keys & {"chosen", "rejected"} else
                      "unpaired" if keys & {"completion", "label"} else "prompt")
            try:
                style = _conversation_style(row["conversations"])
            except RecordError:
                style = "canonical"
            return f"{style}_{suffix}"
        return "sharegpt" if _conversation_style(row["conversations"]) == "sharegpt" else "canonical_sft"
    if "options" in keys:
        return "exam"
    if keys & {"exam_type", "exam_class", "exam_subject"} or {"option", "question"} <= keys:
        return "cmb"
    if "question" in keys and {"A", "B"} <= keys:
        return "ceval"
    if "response_chosen" in keys or "response_rejected" in keys:
        return "reward"
    if "completion" in keys or "label" in keys:
        return "trl_unpaired"
    if "questions" in keys:
        return "huatuo"
    if "instruction" in keys:
        return "alpaca"
    if "ask" in keys:
        return "toyhom"
    if "question" in keys:
        return "grpo"
    if "text" in keys:
        return "text"
    if len(row) == 1 and isinstance(next(iter(row.values())), str):
        return "text"
    names = ", ".join(sorted(safe_name(k) for k in keys)) or "none"
    raise RecordError(f"unrecognised record format (fields: {names})")


def check_kind(kind: str) -> None:
    if kind not in KIND_FORMATS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KIND_FORMATS)})")
