"""Any record a user may want answered, as a prompt to generate from: prompt data as it is (GRPO question/answer,
ShareGPT or canonical turns ending on the user), a conversation of SFT data up to its last user turn (its last
answer becomes the reference), the prompt turns of a preference pair or an unpaired example, a line of plain text
as one user turn, and `{"prompt": "..."}` (a single string field is read as text). A row without its reference
answer is a prompt all the same (answer None): generating needs none. Pure: no Ray, no model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from medgpt_ray.data.convert import record_id
from medgpt_ray.data.exam import exam_prompt
from medgpt_ray.data.fields import _conversation, check_turn_order
from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.files import Quarantined
from medgpt_ray.data.input_paths import expand_paths
from medgpt_ray.data.kinds import KIND_FORMATS, RecordError, detect_format
from medgpt_ray.data.readers import CONVERTERS

FORMAT_KIND = {fmt: kind for kind, fmts in KIND_FORMATS.items() for fmt in fmts}

# The field holding a format's reference answer, and a stand-in its converter accepts: a prompt to generate from
# needs no reference, so a row without one is read with the stand-in and its answer then set to None. (An exam's
# stand-in is a letter every exam has; an SFT format's becomes the assistant turn the prompt then drops.)
REFERENCE_FIELDS = {"grpo": ("answer", None), "sharegpt_prompt": ("answer", None),
                    "canonical_prompt": ("answer", None), "exam": ("answer", "A"), "ceval": ("answer", "A"),
                    "cmb": ("answer", "A"),
                    "alpaca": ("output", "-"), "toyhom": ("answer", "-"), "huatuo": ("answers", "-")}


def _without_reference(fmt: str, row: dict) -> dict | None:
    """`row` with the stand-in for its missing reference answer; None when it has one (or its format none)."""
    if fmt not in REFERENCE_FIELDS or REFERENCE_FIELDS[fmt][0] in row:
        return None
    field, stand_in = REFERENCE_FIELDS[fmt]
    if field == "answers":  # Huatuo: one answer per question group
        groups = row.get("questions")
        return {**row, field: [stand_in] * len(groups)} if isinstance(groups, list) else None
    return {**row, field: stand_in}


def _trailing_answer(turns: list[dict]) -> tuple[list[dict], str | None]:
    """The turns up to the last user (or tool) turn, and the assistant turn after it when there is one."""
    end = len(turns)
    while end and turns[end - 1]["role"] == "assistant":
        end -= 1
    answer = turns[end]["content"] if end < len(turns) else None
    return turns[:end], answer


def as_prompt(row: dict) -> dict:
    """One source row as a canonical prompt record {"conversations", "answer", ["tools"]}; RecordError says why not."""
    fmt = detect_format(row)
    kind = FORMAT_KIND[fmt]
    stood_in = _without_reference(fmt, row)
    row = stood_in or row
    if fmt in ("sharegpt", "canonical_sft"):  # not the SFT converter: a conversation may end on the user here
        turns, tools = _conversation(row, "sharegpt" if fmt == "sharegpt" else "canonical")
        first = {"conversations": turns, "tools": tools}
    else:
        first = CONVERTERS[fmt](row)[0]  # a Huatuo row's several questions: the first
    if kind == "pretrain":
        prompt, answer, tools = [{"role": "user", "content": first["text"]}], None, []
    elif kind == "exam":  # asked as the eval stage asks it; the reference is the right answer's letters
        prompt, answer, tools = [{"role": "user", "content": exam_prompt(first)}], first["answer"], []
    elif kind == "sft":
        prompt, answer = _trailing_answer(first["conversations"])
        tools = first.get("tools") or []
    else:
        prompt, answer, tools = first["conversations"], first.get("answer"), first.get("tools") or []
    if not prompt:
        raise RecordError("no user turn to answer")
    check_turn_order(prompt, last="user")
    record = {"conversations": prompt, "answer": None if stood_in is not None else answer}
    return {**record, "tools": tools} if tools else record


def _source_id(row: dict, file_no: int, line: int) -> str:
    """The row's own "id" when it has a usable one, else its place in the inputs (stable for the same inputs)."""
    own = row.get("id")
    if isinstance(own, str) and own.strip():
        return own.strip()
    if isinstance(own, int) and not isinstance(own, bool):
        return str(own)
    return record_id(file_no, line, 0)


def iter_prompts(paths: Sequence[str | Path]) -> Iterator[tuple[str, dict] | Quarantined]:
    """(prompt id, prompt record) per usable source row of `paths`, or its Quarantined entry with the reason."""
    for file_no, path in enumerate(expand_paths(paths)):
        for line, row in iter_rows(path):
            if isinstance(row, RecordError):
                yield Quarantined(str(path), line, row.reason, row.raw)
                continue
            try:
                yield _source_id(row, file_no, line), as_prompt(row)
            except RecordError as e:
                yield Quarantined(str(path), line, e.reason)
