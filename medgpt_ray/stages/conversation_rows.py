"""SFT conversations as token ids with exact labels: what the sft stage trains on and what the driver's length
profile measures (stages/length_profile.py)."""

from __future__ import annotations

from medgpt_ray import templates
from medgpt_ray.stages.overlong import LengthTally, conversation_cut

ANSWERS = ("assistant", "tool_call")  # the trained turns, one trained span each


def encode_conversations(records: list[dict], tokenizer, template, seq_len: int, policy: str = "truncate"):
    """Tokenize with exact labels (assistant and tool_call turns trained, tool results not). A conversation longer
    than seq_len is cut at a turn boundary or skipped by `policy` (stages/overlong.py's rule), never trained on with
    no target; one with tools when the template has no tool format is skipped. Returns (dataset,
    {"too_long": n, "tools_unsupported": n, "overlong": LengthTally})."""
    from datasets import Dataset

    rows, tally, tools_unsupported = [], LengthTally(seq_len, policy, "conversations", "conversations"), 0
    for r, enc in zip(records, _encoded(records, tokenizer, template), strict=True):
        if isinstance(enc, templates.TemplateToolsUnsupported):
            tools_unsupported += 1
            continue
        n = len(enc["input_ids"])
        cut = n if n <= seq_len else None if policy == "skip" else conversation_cut(
            enc["labels"], seq_len, [t["role"] == "tool_call" for t in r["conversations"] if t["role"] in ANSWERS])
        tally.add(n, "kept" if cut == n else "skipped" if cut is None else "truncated")
        if cut is not None:
            rows.append({k: v[:cut] for k, v in enc.items()})
    if not rows:
        why = (f"template {template.name!r} has no tool format" if tools_unsupported else f"seq_len {seq_len}")
        raise ValueError(f"sft: none of the {len(records)} conversations can be trained ({why}; "
                         f"{tally.skipped} too long, {tools_unsupported} with tools)")
    return Dataset.from_dict({
        "input_ids": [r["input_ids"] for r in rows],
        "attention_mask": [r["attention_mask"] for r in rows],
        "labels": [r["labels"] for r in rows],
    }), {"too_long": tally.skipped, "tools_unsupported": tools_unsupported, "overlong": tally}


BLOCK = 1024  # conversations a tokenizer call takes: batched, and the call's transient copies stay small


def _encoded(records: list[dict], tokenizer, template):
    """encode_sft of each record (or its TemplateToolsUnsupported), BLOCK conversations a tokenizer call."""
    for start in range(0, len(records), BLOCK):
        block = records[start:start + BLOCK]
        yield from templates.encode_sft_many(tokenizer, template, [(r["conversations"], r.get("tools")) for r in block])
