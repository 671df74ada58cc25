"""Source formats -> canonical records (see ARCHITECTURE.md, "Canonical data records", and the issue 13 spec).

Canonical records:

    pretrain:    {"text": str}
    sft:         {"conversations": [turn, ...], "tools": [schema, ...]}   ("tools" only when non-empty)
    preference:  {"conversations": [...prompt turns...], "chosen": str, "rejected": str, "tools": [...]}
    prompt:      {"conversations": [...prompt turns...], "answer": str | None, "tools": [...]}
    unpaired:    {"conversations": [...prompt turns...], "completion": str, "label": bool, "tools": [...]}
    exam:        {"question": str, "options": {"A": str, ...}, "answer": "A" | "AC" ..., "subject"?: str}
                 (data/exam.py; "subject" only where the source names one)
                 (+ "pair": an id shared by the two halves of a preference pair read as unpaired data)

A turn is {"role": R, "content": str}, R one of system (first only), user, assistant, tool_call (the
assistant's function call(s), content canonical JSON, see `canonical_tool_call`) and tool (a tool's result).
The order rule is templates.turn_order_error (one rule for reading and for rendering).

Source formats understood (`detect_format` names):

    text                   {"text": ...}, or any record with a single string field (e.g. a one-column CSV);
                           also every non-empty line of a .txt file (file_rows.py)
    sharegpt               MedicalGPT ShareGPT {"conversations": [{"from", "value"}], "tools"?}, from one of
                           human, gpt, system, function_call, observation (see SHAREGPT_ROLES)
    canonical_sft          {"conversations": [{"role", "content"}], "tools"?} (what the cleaner writes)
    alpaca                 {"instruction", "input", "output"} (+ optional "history" [[q, a], ...], "system");
                           shibing624/medical finetune has this shape
    reward                 shibing624/medical reward {"question", "response_chosen", "response_rejected"}
                           (+ optional "system", "history")
    sharegpt_preference    MedicalGPT DPO {"conversations": [{"from", "value"}], "chosen", "rejected", "tools"?}
    canonical_preference   {"conversations": [{"role", "content"}], "chosen", "rejected", "tools"?}
    huatuo                 Huatuo-26M {"questions": [[q, paraphrase, ...], ...], "answers": [a, ...]}
    toyhom                 Toyhom CSV rows {"department", "title", "ask", "answer"}
    grpo                   MedicalGPT GRPO {"question", "answer"} (+ optional "system")
    sharegpt_prompt        {"conversations": [{"from", "value"}], "answer", "tools"?}
    canonical_prompt       {"conversations": [{"role", "content"}], "answer", "tools"?}
    sharegpt_unpaired      KTO {"conversations": [{"from", "value"}], "completion", "label", "tools"?}
    canonical_unpaired     {"conversations": [{"role", "content"}], "completion", "label", "tools"?}
    trl_unpaired           TRL's KTO {"prompt": str | [{"role", "content"}], "completion": str | [assistant turn],
                           "label"} (+ optional "system")
    exam                   {"question", "options": {letter: text} | [text, ...], "answer": letters} (CMExam-style)
    ceval                  C-Eval {"question", "A", "B", "C", "D", "answer"} (+ "id", "explanation")
    cmb                    CMB {"question", "option": {letter: text}, "answer": letters, "exam_subject",
                           "exam_class", "exam_type", "question_type"} (the subject: the most specific given)

A preference pair read as unpaired data (data/kinds.py ALSO_READ_AS) is two records, chosen with label true and
rejected with label false, as TRL unpairs them; both carry the pair's id in "pair", which keeps them in the same
split and lets a KTO stage score its held-out pairs.

Conversation formats also take an optional top-level "system" string (LLaMA-Factory's form); chosen/rejected
may be given as an assistant turn object ({"from": "gpt", "value"} or {"role": "assistant", "content"}).

Every error raised for a record says why it cannot be used and never quotes the record's text: these
messages end up in reports and logs (ARCHITECTURE.md, data cleaning semantics).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from medgpt_ray.data.exam import from_ceval, from_cmb, from_exam
from medgpt_ray.data.fields import (  # noqa: F401  (the public helpers: imported from here too)
    SHAREGPT_ROLES,
    _answer,
    _completion,
    _content,
    _conversation,
    _history_turns,
    _label,
    _optional,
    _required,
    _response,
    _system_turns,
    _turn,
    _with_tools,
    canonical_tool_call,
    check_turn_order,
    parse_tools,
)
from medgpt_ray.data.kinds import (  # noqa: F401  (RecordError, DataFileError: imported from here by the cleaner)
    KIND_FORMATS,
    DataFileError,
    Kind,
    RecordError,
    check_kind,
    detect_format,
    safe_name,
)
from medgpt_ray.templates import turn_order_error  # noqa: F401  (tests import it from here)

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")

def _preference(prompt: list[dict], chosen: str, rejected: str, tools: list[dict] | None = None) -> dict:
    check_turn_order(prompt, last="user")
    if chosen == rejected:
        raise RecordError("chosen and rejected responses are identical")
    return _with_tools({"conversations": prompt, "chosen": chosen, "rejected": rejected}, tools or [])


def _sft(turns: list[dict], tools: list[dict] | None = None) -> dict:
    check_turn_order(turns, last="assistant")
    return _with_tools({"conversations": turns}, tools or [])


def _prompt(prompt: list[dict], answer: str | None, tools: list[dict] | None = None) -> dict:
    check_turn_order(prompt, last="user")
    return _with_tools({"conversations": prompt, "answer": answer}, tools or [])


def _unpaired(prompt: list[dict], completion: str, label: bool, tools: list[dict] | None = None) -> dict:
    check_turn_order(prompt, last="user")
    return _with_tools({"conversations": prompt, "completion": completion, "label": label}, tools or [])


def pair_id(pair: dict) -> str:
    """The id the two unpaired halves of a preference pair share: a hash of the canonical pair (no text)."""
    return hashlib.blake2b(json.dumps(pair, sort_keys=True, ensure_ascii=False).encode("utf-8"),
                           digest_size=8).hexdigest()


def unpair(pair: dict) -> list[dict]:
    """A canonical preference pair as two unpaired records (chosen desirable, rejected undesirable), as TRL's
    unpair_preference_dataset does, each carrying the pair's id."""
    prompt, tools, pid = pair["conversations"], pair.get("tools") or [], pair_id(pair)
    return [{**_unpaired(prompt, pair[key], key == "chosen", tools), "pair": pid} for key in ("chosen", "rejected")]


# --------------------------------------------------------------------------------------------------
# Converters: one per format, each returns the canonical records of one source row
# --------------------------------------------------------------------------------------------------


def _from_text(row: dict) -> list[dict]:
    if "text" in row:
        return [{"text": _required(row, "text")}]
    (key, value), = row.items()  # detect_format guarantees a single string field here
    return [{"text": _content(value, f"field {safe_name(key)}")}]


def _sft_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        return [_sft(*_conversation(row, style))]
    return convert


def _preference_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        prompt, tools = _conversation(row, style)
        return [_preference(prompt, _response(row, "chosen"), _response(row, "rejected"), tools)]
    return convert


def _prompt_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        prompt, tools = _conversation(row, style)
        return [_prompt(prompt, _answer(row), tools)]
    return convert


def _unpaired_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        prompt, tools = _conversation(row, style)
        return [_unpaired(prompt, _completion(row), _label(row), tools)]
    return convert


def _from_trl_unpaired(row: dict) -> list[dict]:
    """TRL's KTO rows: "prompt" a string (one user turn) or a list of role/content (or from/value) turns."""
    if "prompt" not in row:
        raise RecordError("missing field 'prompt'")
    value = row["prompt"]
    if isinstance(value, list):
        turns, _ = _conversation({"conversations": value, "system": row.get("system")},
                                 "sharegpt" if value and isinstance(value[0], dict) and "from" in value[0]
                                 else "canonical")
    else:
        turns = _system_turns(row) + [_turn("user", _content(value, "field 'prompt'"))]
    return [_unpaired(turns, _completion(row), _label(row), parse_tools(row.get("tools")))]


def _from_alpaca(row: dict) -> list[dict]:
    instruction = _required(row, "instruction")
    extra = _optional(row, "input")
    user = f"{instruction}\n{extra}" if extra else instruction
    last = [_turn("user", user), _turn("assistant", _required(row, "output"))]
    return [_sft(_system_turns(row) + _history_turns(row) + last)]


def _from_reward(row: dict) -> list[dict]:
    prompt = _system_turns(row) + _history_turns(row) + [_turn("user", _required(row, "question"))]
    return [_preference(prompt, _required(row, "response_chosen"), _required(row, "response_rejected"))]


def _from_huatuo(row: dict) -> list[dict]:
    """Each question group holds paraphrases of one question; every paraphrase becomes its own record
    paired with the group's answer (so one source row gives several canonical records)."""
    questions, answers = row.get("questions"), row.get("answers")
    if not isinstance(questions, list):
        raise RecordError("field 'questions' is missing or not a list")
    if not isinstance(answers, list):
        raise RecordError("field 'answers' is missing or not a list")
    if not questions:
        raise RecordError("field 'questions' is empty")
    if len(questions) != len(answers):
        raise RecordError(f"question groups and answers differ in number ({len(questions)} vs {len(answers)})")
    out = []
    for g, (group, answer) in enumerate(zip(questions, answers, strict=True), 1):
        answer_text = _content(answer, f"answer {g}")
        paraphrases = [group] if isinstance(group, str) else group
        if not isinstance(paraphrases, list) or not paraphrases:
            raise RecordError(f"question group {g} is not a non-empty list")
        for p, q in enumerate(paraphrases, 1):
            question = _content(q, f"question {g}.{p}")
            out.append(_sft([_turn("user", question), _turn("assistant", answer_text)]))
    return out


def _from_toyhom(row: dict) -> list[dict]:
    title, ask = _optional(row, "title"), _required(row, "ask")
    user = f"{title}\n{ask}" if title else ask
    return [_sft([_turn("user", user), _turn("assistant", _required(row, "answer"))])]


def _from_grpo(row: dict) -> list[dict]:
    """MedicalGPT GRPO {"question", "answer"}: a one-turn prompt and its reference answer."""
    prompt = _system_turns(row) + [_turn("user", _required(row, "question"))]
    return [_prompt(prompt, _answer(row))]


CONVERTERS: dict[str, Callable[[dict], list[dict]]] = {
    "text": _from_text,
    "sharegpt": _sft_converter("sharegpt"),
    "canonical_sft": _sft_converter("canonical"),
    "alpaca": _from_alpaca,
    "reward": _from_reward,
    "sharegpt_preference": _preference_converter("sharegpt"),
    "canonical_preference": _preference_converter("canonical"),
    "huatuo": _from_huatuo,
    "toyhom": _from_toyhom,
    "grpo": _from_grpo,
    "sharegpt_prompt": _prompt_converter("sharegpt"),
    "canonical_prompt": _prompt_converter("canonical"),
    "sharegpt_unpaired": _unpaired_converter("sharegpt"),
    "canonical_unpaired": _unpaired_converter("canonical"),
    "trl_unpaired": _from_trl_unpaired,
    "exam": from_exam,
    "ceval": from_ceval,
    "cmb": from_cmb,
}
assert set(CONVERTERS) == {f for fmts in KIND_FORMATS.values() for f in fmts}


def convert_as(row: dict, fmt: str, kind: str) -> list[dict]:
    """`row` (of format `fmt`) as canonical `kind` records; a record of a kind ALSO_READ_AS `kind` is converted
    to that kind first (a preference pair read as unpaired data: its two halves)."""
    if kind == "unpaired" and fmt in KIND_FORMATS["preference"]:
        return [half for pair in CONVERTERS[fmt](row) for half in unpair(pair)]
    if kind == "exam" and fmt == "grpo":  # a question without its options
        raise RecordError("missing field 'options' (an exam question lists its options)")
    if fmt not in KIND_FORMATS[kind]:
        raise RecordError(f"a {fmt} record cannot be used as {kind} data "
                          f"(accepted formats: {', '.join(KIND_FORMATS[kind])})")
    return CONVERTERS[fmt](row)


def to_canonical(row: dict, kind: Kind) -> list[dict]:
    """Convert one source row into canonical record(s) of `kind`; RecordError says why it cannot be."""
    check_kind(kind)
    return convert_as(row, detect_format(row), kind)
