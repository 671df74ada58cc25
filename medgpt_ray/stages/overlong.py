"""Records longer than a stage's `seq_len`: the one rule per kind of record, and the counts every stage reports.

The rule (docs/data.md, "Records longer than seq_len"; the stage key `overlong: truncate | skip` chooses where both make
sense):

- blocks (pt): the text is packed into blocks of seq_len; nothing is cut off or left out.
- conversations (sft): `truncate` keeps the conversation's start and cuts it at a turn boundary: after the last
  answer that fits whole, or inside the last answer that fits in part when at least ANSWER_FLOOR of its tokens fit.
  A cut never falls inside a prompt turn (system, tools block, user, tool result) nor inside a tool call. A
  conversation whose first answer does not get ANSWER_FLOOR tokens (its prompt alone is too long) is skipped.
  `skip` leaves out every conversation longer than seq_len.
- pairs and unpaired examples (rm, dpo, orpo, simpo, kto): the prompt is kept whole; `truncate` cuts the responses'
  tails so that prompt + response fits (the trainers' keep-start convention), `skip` leaves the example out. Either
  way an example whose prompt leaves fewer than ANSWER_FLOOR tokens for its response is skipped.
- prompts (grpo, rloo, opd): `truncate` keeps the prompt's end (TRL's left truncation: the start, system turn and
  tools block first, is cut off) so that the completion still fits; `skip` leaves the prompt out.

Counts only: nothing here keeps or logs record text (PII)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

IGNORE_INDEX = -100
# The fewest tokens of an answer a cut may leave: a response cut after a handful of tokens teaches little beyond
# how answers start, and the pair trainers compare two such stubs.
ANSWER_FLOOR = 16
KEEP_SHARE = 0.99  # the warning suggests the seq_len that keeps this share of a stage's records whole
WARN_SHARE = 0.05  # more than this share truncated or skipped: a warning line
# A suggested seq_len this many times the stage's is no seq_len to train at: the records past it are outliers (a
# 5 MB record once made the warning suggest 873,845), which the warning names as such instead.
OUTLIER_RATIO = 8
POLICIES = ("truncate", "skip")
RULES = {
    "conversations": "cut after the last answer that fits (inside it past its first {floor} tokens); skipped when "
                     "the prompt before the first answer leaves fewer than {floor} tokens",
    "pairs": "prompt kept whole, responses cut at their tail; skipped when the prompt leaves fewer than {floor} "
             "tokens for a response",
    "prompts": "prompt's end kept (left truncation) so the completion fits",
    "skip": "every record longer than seq_len left out",
}


@dataclass
class LengthTally:
    """Per stage: how many records were read, kept whole, truncated, skipped as too long, and the full token
    lengths of the truncated and skipped ones (for the seq_len that would keep KEEP_SHARE of them whole)."""

    seq_len: int
    policy: str
    unit: str  # what a record is: conversations, pairs, examples, prompts
    rule: str  # RULES' key
    records: int = 0
    truncated: int = 0
    skipped: int = 0
    over_lengths: list[int] = field(default_factory=list)

    def add(self, full_len: int, outcome: str) -> None:
        """One record of `full_len` tokens: outcome kept, truncated or skipped."""
        self.records += 1
        if outcome == "kept":
            return
        self.over_lengths.append(full_len)
        if outcome == "truncated":
            self.truncated += 1
        else:
            self.skipped += 1

    def state(self) -> dict[str, Any]:
        """Everything, lengths too: what a worker hands the others (merged)."""
        return asdict(self)

    @classmethod
    def merged(cls, tallies: Iterable[dict[str, Any]]) -> LengthTally:
        """The stage's tally from every worker's state()."""
        items = list(tallies)
        out = cls(**{k: items[0][k] for k in ("seq_len", "policy", "unit", "rule")})
        for t in items:
            out.records += t["records"]
            out.truncated += t["truncated"]
            out.skipped += t["skipped"]
            out.over_lengths += t["over_lengths"]
        return out

    def keep_seq_len(self, share: float = KEEP_SHARE) -> int:
        """The smallest seq_len under which `share` of the records are kept whole (seq_len itself when they are)."""
        if not self.records:
            return self.seq_len
        k = max(0, math.ceil(share * self.records) - 1)  # nearest rank, 0-based
        fitting = self.records - len(self.over_lengths)
        if k < fitting:
            return self.seq_len
        return sorted(self.over_lengths)[k - fitting]

    def to_dict(self, context: int | None = None) -> dict[str, Any]:
        """What result.json, summary.json and the report carry: counts, never lengths of single records. With the
        model's context (the most tokens it reads), how many records are longer than even that."""
        out = {"seq_len": self.seq_len, "policy": self.policy, "unit": self.unit, "rule": self.rule_text(),
               "records": self.records, "truncated": self.truncated, "skipped": self.skipped,
               "keep_99_seq_len": self.keep_seq_len()}
        if context:
            out |= {"model_context": context, "over_context": sum(n > context for n in self.over_lengths)}
        return out

    def rule_text(self) -> str:
        return RULES["skip" if self.policy == "skip" else self.rule].format(floor=ANSWER_FLOOR)


def answer_spans(labels: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each trained run of `labels` (an answer: its content and end-of-turn suffix)."""
    spans, start = [], None
    for i, label in enumerate(labels):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(labels)))
    return spans


def conversation_cut(labels: list[int], seq_len: int, whole_only: Iterable[bool] = ()) -> int | None:
    """Where a conversation longer than seq_len is cut (its kept prefix's length), or None when no answer gets
    ANSWER_FLOOR tokens. `whole_only[i]`: the i-th answer may not be cut inside (a tool call: half a JSON object)."""
    spans, whole = answer_spans(labels), list(whole_only)
    if len(whole) != len(spans):  # a template that joins turns into one trained run: no turn to tell apart
        whole = []
    best = None
    for i, (start, end) in enumerate(spans):
        if end <= seq_len:
            best = end  # the answer fits whole: a turn boundary
        elif start + ANSWER_FLOOR <= seq_len and not (i < len(whole) and whole[i]):
            best = seq_len  # inside the answer, past its first tokens
        if end >= seq_len:
            break
    return best


def pair_outcome(prompt_len: int, response_len: int, seq_len: int, policy: str) -> str:
    """kept, truncated or skipped: a prompt kept whole and its (longest) response cut at the tail."""
    if prompt_len + response_len <= seq_len:
        return "kept"
    if policy == "skip" or seq_len - prompt_len < ANSWER_FLOOR:
        return "skipped"
    return "truncated"


def prompt_outcome(prompt_len: int, room: int, policy: str) -> str:
    """kept, truncated (its end kept) or skipped: a prompt that must fit in `room` tokens."""
    if prompt_len <= room:
        return "kept"
    return "skipped" if policy == "skip" or room < 1 else "truncated"


def warning_line(stage: str, tally: dict[str, Any]) -> str | None:
    """The warning when more than WARN_SHARE of a stage's records were truncated or skipped; None otherwise."""
    affected = tally["truncated"] + tally["skipped"]
    if not tally["records"] or affected <= WARN_SHARE * tally["records"]:
        return None
    head = (f"[{stage:>3}] warning: {affected:,} of {tally['records']:,} {tally['unit']} "
            f"({100 * affected / tally['records']:.0f} %) are longer than seq_len {tally['seq_len']:,} "
            f"({tally['truncated']:,} truncated, {tally['skipped']:,} skipped); ")
    context = tally.get("model_context")
    if context and tally["keep_99_seq_len"] > context:  # no seq_len the model reads keeps 99 % whole
        return head + (f"even the model's context as seq_len ({context:,} tokens) would still cut "
                       f"{tally['over_context']:,} of them: split them, or leave them out (stages.{stage}.overlong: "
                       "skip)")
    if tally["keep_99_seq_len"] > OUTLIER_RATIO * tally["seq_len"]:
        return head + (f"keeping 99 % whole would take a seq_len over {OUTLIER_RATIO}x this one: the longest are "
                       f"outliers, better split or left out (stages.{stage}.overlong: skip) than trained at that "
                       "length")
    return head + f"seq_len {tally['keep_99_seq_len']:,} would keep 99 % whole (stages.{stage}.seq_len)"


def brief(tally: dict[str, Any]) -> str:
    """The stage's done line's words for it."""
    return (f"{tally['truncated']:,} truncated, {tally['skipped']:,} skipped of {tally['records']:,} "
            f"{tally['unit']} over seq_len {tally['seq_len']:,}")
