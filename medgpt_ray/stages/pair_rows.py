"""Preference pairs as the reward model scores them: prompt + chosen and prompt + rejected token ids. What the rm
stage trains on (packed or not) and what the driver's length profile measures (stages/length_profile.py)."""

from __future__ import annotations

from medgpt_ray import templates
from medgpt_ray.stages.overlong import LengthTally, pair_outcome


def encode_pairs(records: list[dict], tokenizer, template, seq_len: int, policy: str = "truncate"):
    """Each pair as prompt + chosen and prompt + rejected token ids. Longer than seq_len: the prompt kept whole and
    the responses cut at their tail, or the pair skipped, by `policy` (stages/overlong.py's rule); a pair with tools
    the template cannot render is skipped. Returns (dataset, {"too_long", "tools_unsupported", "overlong"})."""
    from datasets import Dataset

    chosen, rejected, tools_unsupported = [], [], 0
    tally = LengthTally(seq_len, policy, "pairs", "pairs")
    for r in records:
        try:
            enc = templates.encode_preference(tokenizer, template, r)
        except templates.TemplateToolsUnsupported:
            tools_unsupported += 1  # tools, and the template has no tool format: counted
            continue
        prompt, longest = len(enc["prompt_ids"]), max(len(enc["chosen_ids"]), len(enc["rejected_ids"]))
        outcome = pair_outcome(prompt, longest, seq_len, policy)
        tally.add(prompt + longest, outcome)
        if outcome != "skipped":  # never scored on an empty or stub answer
            chosen.append((enc["prompt_ids"] + enc["chosen_ids"])[:seq_len])
            rejected.append((enc["prompt_ids"] + enc["rejected_ids"])[:seq_len])
    if not chosen:
        raise ValueError(f"rm: none of the {len(records)} pairs can be scored ({tally.skipped} do not fit "
                         f"seq_len {seq_len}, {tools_unsupported} have tools template "
                         f"{template.name!r} cannot render)")
    return Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected}), {
        "too_long": tally.skipped, "tools_unsupported": tools_unsupported, "overlong": tally}
