"""The exam kind: multiple-choice questions (CMExam / C-Eval style), read, checked and put as a prompt.

Canonical record: {"question": str, "options": {"A": str, "B": str, ...}, "answer": "A" | "AC" ..., "subject"?: str}:
option letters A-Z in order with no gap, at least two options, the answer one or more distinct option letters,
sorted; "subject" (what per-subject accuracy groups by) only where the source names one, so a record without one is
the record it always was (same hash key, same id).

Source formats (data/readers.py):

    exam   {"question", "options": {"A": ..., ...} | [..., ...], "answer": "A" | "AC" | "A,C" | ["A", "C"]}
           (+ "subject")
    ceval  C-Eval's columns {"question", "A", "B", "C", "D", ..., "answer"} (+ "id", "explanation", ignored)
    cmb    CMB's {"exam_type", "exam_class", "exam_subject", "question", "answer", "question_type",
           "option": {"A": ..., ...}}: the subject is the most specific of exam_subject, exam_class, exam_type given

How a question is asked (`exam_prompt`) and answered (`option_text`, `answer_text`) is defined here once: the eval
stage scores each option's text after the prompt and parses the letter a model generates (`parse_letters`); a test
trains a model on the answers in the same words. Every error is a RecordError that never quotes record text."""

from __future__ import annotations

import itertools
import re
import string

from medgpt_ray.data.kinds import RecordError

LETTERS = string.ascii_uppercase
_SEPARATORS = re.compile(r"[\s,，、;；/和及]+")
INSTRUCTION = "以下是一道医学选择题，请选出正确答案，先写出选项字母。"


def _text(value: object, where: str) -> str:
    if value is None:
        raise RecordError(f"missing {where}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # a numeric option ("5 mg" is a string; 5 is a number) reads as its text
    if not isinstance(value, str):
        raise RecordError(f"{where} is a {type(value).__name__}, not a string")
    if not value.strip():
        raise RecordError(f"empty {where}")
    return value.strip()


def _options(value: object, name: str = "options") -> dict[str, str]:
    if value is None:
        raise RecordError(f"missing field {name!r}")
    if isinstance(value, list):
        if len(value) > len(LETTERS):
            raise RecordError(f"{len(value)} options: at most {len(LETTERS)} (A-Z)")
        value = dict(zip(LETTERS, value, strict=False))
    if not isinstance(value, dict):
        raise RecordError(f"field {name!r} is a {type(value).__name__}, not an object or a list")
    out: dict[str, str] = {}
    for key, text in value.items():
        letter = key.strip().upper() if isinstance(key, str) else ""
        if len(letter) != 1 or letter not in LETTERS:
            raise RecordError("an option key is not a single letter A-Z")
        if letter in out:
            raise RecordError(f"option {letter} is given twice")
        out[letter] = _text(text, f"option {letter}")
    if len(out) < 2:
        raise RecordError(f"{len(out)} option(s): a multiple-choice question needs at least 2")
    letters = sorted(out)
    if letters != list(LETTERS[: len(letters)]):
        raise RecordError(f"option letters {''.join(letters)} are not A.. in order without a gap")
    return {k: out[k] for k in letters}


def _answer(value: object, options: dict[str, str]) -> str:
    if value is None:
        raise RecordError("missing field 'answer'")
    if isinstance(value, list):
        value = ",".join(v if isinstance(v, str) else "?" for v in value)
    if not isinstance(value, str):
        raise RecordError(f"field 'answer' is a {type(value).__name__}, not a string of option letters")
    letters = _SEPARATORS.sub("", value).upper()
    if not letters:
        raise RecordError("empty field 'answer'")
    if not all(ch in LETTERS for ch in letters):
        raise RecordError("field 'answer' is not option letters (A-Z)")
    missing = sorted(set(letters) - set(options))
    if missing:
        raise RecordError(f"answer {''.join(missing)} is not among the options {''.join(options)}")
    if len(set(letters)) != len(letters):
        raise RecordError("field 'answer' names an option twice")
    return "".join(sorted(letters))


def exam_record(question: object, options: object, answer: object, options_field: str = "options") -> dict:
    """The canonical exam record; RecordError says why the fields cannot make one."""
    text = _text(question, "field 'question'")
    opts = _options(options, options_field)
    return {"question": text, "options": opts, "answer": _answer(answer, opts)}


def subject(row: dict, fields: tuple[str, ...]) -> dict[str, str]:
    """{"subject": the first of `fields` the row gives (a non-blank string)}, or {} when it gives none; a field
    given as anything but a string (or null) is a RecordError naming it."""
    for name in fields:
        value = row.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RecordError(f"field {name!r} is a {type(value).__name__}, not a string")
        if value.strip():
            return {"subject": value.strip()}
    return {}


def from_exam(row: dict) -> list[dict]:
    if "question" not in row:
        raise RecordError("missing field 'question'")
    return [{**exam_record(row["question"], row.get("options"), row.get("answer")), **subject(row, ("subject",))}]


def from_ceval(row: dict) -> list[dict]:
    """C-Eval's columns: options A, B, C, ... as fields of their own (the first gap ends them)."""
    options = {}
    for letter in LETTERS:
        if row.get(letter) is None:
            break
        options[letter] = row[letter]
    return [exam_record(row.get("question"), options, row.get("answer"))]


CMB_SUBJECT_FIELDS = ("exam_subject", "exam_class", "exam_type")  # the most specific first


def from_cmb(row: dict) -> list[dict]:
    """CMB's exam records: options under the singular "option" (an object; a blank last option, a padded slot, is
    left out), the subject from exam_subject, else exam_class, else exam_type; question_type is not read (the
    answer's letters say how many are right)."""
    options = row.get("option")
    if isinstance(options, dict):
        letters = sorted(options, key=lambda k: str(k).strip().upper())
        while letters and _blank(options[letters[-1]]):
            letters.pop()
        options = {k: options[k] for k in letters}
    return [{**exam_record(row.get("question"), options, row.get("answer"), "option"),
             **subject(row, CMB_SUBJECT_FIELDS)}]


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def exam_prompt(record: dict) -> str:
    """The question as the user turn: instruction, question, one line per option."""
    lines = [INSTRUCTION, "", record["question"]]
    lines += [f"{letter}. {text}" for letter, text in record["options"].items()]
    return "\n".join(lines)


def option_text(record: dict, letter: str) -> str:
    """An answer naming one option, as the eval stage scores it."""
    return f"{letter}. {record['options'][letter]}"


def answer_text(record: dict, letters: str | None = None) -> str:
    """An answer naming `letters` (default: the right ones) in option_text's words, one line per option."""
    return "\n".join(option_text(record, letter) for letter in (letters or record["answer"]))


def candidates(record: dict) -> list[str]:
    """The answers a model chooses among by log-likelihood: every set of as many options as the question has right
    answers (one: each option; "AC" of four: the six pairs), as sorted letters."""
    return ["".join(c) for c in itertools.combinations(record["options"], len(record["answer"]))]


def parse_letters(response: str, options: dict[str, str]) -> str:
    """The option letters a generated answer starts with (sorted), or the first option letter anywhere in it;
    "" when it names none. "A. ...", "AC", "A、C" and "答案：B" all read as their letters."""
    text = response.strip().upper()
    lead = re.match(r"^(?:答案[:：]?\s*)?([A-Z][A-Z\s,，、和及]*)", text)
    if lead:
        letters = [ch for ch in lead.group(1) if ch in LETTERS]
        if all(ch in options for ch in letters) and len(set(letters)) == len(letters):
            return "".join(sorted(letters))
    first = next((ch for ch in text if ch in LETTERS and ch in options), None)
    return first or ""
