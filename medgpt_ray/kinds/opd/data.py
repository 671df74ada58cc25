"""opd's examples: an SFT conversation as a prompt (every turn before its last assistant answer, rendered by the
chat template) and that answer, the reference the teacher and student are compared on when the student does not
answer itself; and the collator that hands GKDTrainer both (left-padded, as generation wants them)."""

from __future__ import annotations

from typing import Any

from medgpt_ray import templates
from medgpt_ray.stages.overlong import LengthTally, prompt_outcome

IGNORE_INDEX = -100
ANSWER_ROLES = ("assistant", "tool_call")


def last_answer_span(labels: list[int]) -> tuple[int, int]:
    """[start, end) of the last trained span: the last assistant turn, through its end-of-turn suffix (the
    separator the template writes after it is not part of the answer)."""
    end = max(i for i, label in enumerate(labels) if label != IGNORE_INDEX) + 1
    start = end - 1
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return start, end


def encode_prompt_answer(records: list[dict], tokenizer, template, seq_len: int, max_new_tokens: int,
                         policy: str = "truncate"):
    """(dataset of input_ids + prompt_len, skipped counts). A conversation is cut after its last answer. One whose
    prompt leaves fewer than max_new_tokens of seq_len (the student's own answer must fit) keeps the prompt's end
    (left truncation) or is left out, by `policy`; a reference answer longer than the rest of seq_len is cut there
    (truncated too). One the template cannot render (tools without a tool format) is left out."""
    from datasets import Dataset

    rows, tools_unsupported = {"input_ids": [], "prompt_len": []}, 0
    tally = LengthTally(seq_len, policy, "conversations", "prompts")
    for r in records:
        turns = r["conversations"]
        last = max((i for i, t in enumerate(turns) if t["role"] in ANSWER_ROLES), default=None)
        if last is None:
            continue
        try:
            enc = templates.encode_sft(tokenizer, template, turns[:last + 1], tools=r.get("tools"))
        except templates.TemplateToolsUnsupported:
            tools_unsupported += 1
            continue
        start, end = last_answer_span(enc["labels"])
        full = max(end, start + max_new_tokens)  # the reference answer, or the student's own, must fit
        outcome = prompt_outcome(full, seq_len, policy) if max_new_tokens < seq_len else "skipped"
        cut = max(0, start + max_new_tokens - seq_len)  # the prompt's first tokens that do not fit
        kept = enc["input_ids"][cut:end][:seq_len]
        tally.add(full, outcome)
        if outcome != "skipped":
            rows["input_ids"].append(kept)
            rows["prompt_len"].append(start - cut)
    if not rows["input_ids"]:
        raise ValueError(f"opd: none of the {len(records)} conversations leaves max_new_tokens {max_new_tokens} "
                         f"for an answer in seq_len {seq_len} ({tally.skipped} skipped, {tools_unsupported} with "
                         f"tools the template cannot render)")
    return Dataset.from_dict(rows), {"prompt_too_long": tally.skipped, "tools_unsupported": tools_unsupported,
                                     "overlong": tally}


class PromptAnswerCollator:
    """What GKDTrainer reads: the whole sequence (input_ids, attention_mask; labels on the answer only) and the
    prompt alone (prompts, prompt_attention_mask) for the student's own answers, all left-padded."""

    def __init__(self, pad_token_id: int):
        self.pad = pad_token_id

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        def left_pad(seqs: list[list[int]], value: int) -> torch.Tensor:
            width = max(len(s) for s in seqs)
            return torch.tensor([[value] * (width - len(s)) + list(s) for s in seqs], dtype=torch.long)

        ids = [e["input_ids"] for e in examples]
        prompts = [e["input_ids"][:e["prompt_len"]] for e in examples]
        labels = [[IGNORE_INDEX] * e["prompt_len"] + list(e["input_ids"][e["prompt_len"]:]) for e in examples]
        return {"input_ids": left_pad(ids, self.pad), "attention_mask": left_pad([[1] * len(s) for s in ids], 0),
                "labels": left_pad(labels, IGNORE_INDEX), "prompts": left_pad(prompts, self.pad),
                "prompt_attention_mask": left_pad([[1] * len(p) for p in prompts], 0)}
