"""Preference records as TRL's preference trainers take them: the prompt rendered by our template (with the record's
tools), each response closed by the template's end of turn, pairs longer than seq_len cut or skipped by the stage's
`overlong` rule (stages/overlong.py). Shared by dpo, kto, orpo and simpo, and the prompts by grpo, rloo and the
driver's length profile (stages/length_profile.py)."""

from __future__ import annotations

import sys
from typing import Any

from medgpt_ray import templates
from medgpt_ray.stages.overlong import LengthTally, pair_outcome


def rendered_prompts(records: list[dict], tokenizer, template) -> tuple[list[str], list[dict], list[int], int]:
    """(prompts, the records they belong to, each prompt's tokens, how many records were left out for tools the
    template cannot render): each record's prompt turns rendered by our template."""
    prompts, kept, tools_unsupported = [], [], 0
    for r in records:
        try:
            prompts.append(templates.render_prompt(template, tokenizer, r["conversations"], tools=r.get("tools")))
        except templates.TemplateToolsUnsupported:
            tools_unsupported += 1
            continue
        kept.append(r)
    return prompts, kept, token_counts(tokenizer, prompts), tools_unsupported


def token_counts(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def fitted_examples(records: list[dict], tokenizer, template, seq_len: int | None, policy: str, unit: str,
                    responses: tuple[str, ...], carried: tuple[str, ...] = ()
                    ) -> tuple[dict[str, list], dict[str, Any]]:
    """Rows of the prompt and each field of `responses` closed by the template's end-of-turn token, with the
    examples longer than seq_len (prompt + longest response) cut or skipped by `policy` (stages/overlong.py's rule:
    the trainers keep the prompt and cut the responses' tails), and the fields of `carried` as they are; ValueError
    naming `unit` when none is left."""
    prompts, kept, prompt_lens, tools_unsupported = rendered_prompts(records, tokenizer, template)
    texts = {k: [templates.response_text(template, tokenizer, r[k]) for r in kept] for k in responses}
    longest = [max(n) for n in zip(*(token_counts(tokenizer, t) for t in texts.values()), strict=True)] if kept else []
    tally = LengthTally(seq_len if seq_len is not None else sys.maxsize, policy, unit, "pairs")
    rows: dict[str, list] = {"prompt": [], **{k: [] for k in responses + carried}}
    for i, prompt in enumerate(prompts):
        outcome = pair_outcome(prompt_lens[i], longest[i], tally.seq_len, policy)
        tally.add(prompt_lens[i] + longest[i], outcome)
        if outcome != "skipped":  # TRL would train it on an empty answer: no target, or a NaN loss under ORPO/CPO
            rows["prompt"].append(prompt)
            for k in responses:
                rows[k].append(texts[k][i])
            for k in carried:
                rows[k].append(kept[i][k])
    if records and not rows["prompt"]:
        raise ValueError(f"none of the {len(records)} {unit} can be trained: {tools_unsupported} have tools template "
                         f"{template.name!r} cannot render, {tally.skipped} do not fit seq_len {seq_len}")
    return rows, {"too_long": tally.skipped, "tools_unsupported": tools_unsupported, "overlong": tally}


def preference_texts(records: list[dict], tokenizer, template, seq_len: int | None = None, policy: str = "truncate"):
    """Prompt rendered by our template (with the record's tools); responses closed by the template's end-of-turn
    token, which TRL then sees as already ending with EOS when the tokenizer's EOS is that token. Left out and
    counted: pairs with tools when the template has no tool format, and pairs longer than seq_len by `policy`.
    Returns (dataset, {"tools_unsupported": n, "too_long": n, "overlong": LengthTally})."""
    from datasets import Dataset

    rows, skipped = fitted_examples(records, tokenizer, template, seq_len, policy, "pairs", ("chosen", "rejected"))
    return Dataset.from_dict(rows), skipped
