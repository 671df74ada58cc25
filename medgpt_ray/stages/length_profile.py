"""Measure a stage's training lengths before it is planned (memory/lengths.py says how the plan uses them).

Runs on the driver, after data preparation: the first SAMPLE_RECORDS records of the stage's train split (hash
order, so a uniform sample; the records the packed worker sized its step from before) tokenized exactly as the
stage encodes them — sft by encode_sft with the template and seq_len cut, rm and dpo by encode_preference, each
pair's longer side, kto each example's prompt and completion, grpo each prompt plus max_completion_length — and,
for SFT and rm with packing not off, packed by the same best-fit decreasing as the workers (rm: whole pairs in
rows of 2 x seq_len).
The tokenizer is the base model's: every stage saves the tokenizer it started from unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from medgpt_ray import models, templates
from medgpt_ray.config import StageConfig, overlong_policy, stage_kind
from medgpt_ray.data.shards import num_rows, read_records
from medgpt_ray.memory.lengths import SAMPLE_RECORDS, LengthProfile, packing_setting
from medgpt_ray.memory.profiles import stage_profile
from medgpt_ray.stages.overlong import pair_outcome, prompt_outcome


def measure(stage: str, cfg: StageConfig, template_name: str, base_model: Path, train_file: str
            ) -> LengthProfile | None:
    """The stage's length profile, of what its kind measures (StageKind.measures); None for a kind that trains on
    blocks (pretraining: always seq_len long). Packed where the stage packs (lengths.packing_setting)."""
    measures, profile = stage_kind(stage).measures, stage_profile(stage)
    if measures == "blocks":
        return None
    tok = models.load_tokenizer(base_model)
    template = templates.get_template(template_name)
    templates.check_template(template, tok)
    records = read_records(train_file, 0, SAMPLE_RECORDS)
    total = num_rows(train_file)
    if measures == "conversations":
        return _sft_profile(records, total, tok, template, cfg, packing_setting(stage, cfg) is not False)
    if measures == "prompts":
        return _prompt_profile(records, total, tok, template, cfg)
    lengths, over, policy = [], 0, overlong_policy(cfg)
    for r in records:
        if measures == "completions":  # one completion per example: measured as a pair of it with itself
            r = {**r, "chosen": r["completion"], "rejected": r["completion"]}
        try:
            enc = templates.encode_preference(tok, template, r)
        except templates.TemplateToolsUnsupported:
            over += 1  # tools the template cannot render: not trained
            continue
        prompt = len(enc["prompt_ids"])
        longest = max(len(enc["chosen_ids"]), len(enc["rejected_ids"]))
        if pair_outcome(prompt, longest, cfg.seq_len, policy) == "skipped":
            over += 1  # longer than seq_len and left out (stages/overlong.py)
            continue
        lengths.append(min(prompt + longest, cfg.seq_len))
    packed = profile.packs and packing_setting(stage, cfg) is not False  # rm: whole pairs in packed rows
    per_row = _pairs_per_row(records, tok, template, cfg) if packed else None
    return LengthProfile.of(lengths, total, cfg.seq_len, per_row,
                            over_seq_len=over + sum(x >= cfg.seq_len for x in lengths), sampled=len(records))


def _prompt_profile(records: list[dict], total: int, tok, template, cfg: StageConfig) -> LengthProfile:
    """GRPO: each prompt as the stage renders it (cut to seq_len - max_completion_length, or left out, by
    `overlong`), plus the max_completion_length tokens a generated batch is padded up to."""
    from medgpt_ray.stages.preference_rows import rendered_prompts

    _, _, prompt_lens, tools_unsupported = rendered_prompts(records, tok, template)
    room, policy = cfg.seq_len - cfg.max_completion_length, overlong_policy(cfg)
    lengths = [min(n, room) + cfg.max_completion_length for n in prompt_lens
               if prompt_outcome(n, room, policy) != "skipped"]
    return LengthProfile.of(lengths, total, cfg.seq_len, None,
                            over_seq_len=tools_unsupported + sum(n > room for n in prompt_lens), sampled=len(records))


def _pairs_per_row(records: list[dict], tok, template, cfg: StageConfig) -> float | None:
    """The sample's pairs per packed row (stages/reward_packing.py); None when none of them fits."""
    from medgpt_ray.stages import packing, reward_packing
    from medgpt_ray.stages.pair_rows import encode_pairs

    try:
        encoded = encode_pairs(records, tok, template, cfg.seq_len, overlong_policy(cfg))[0]
    except ValueError:  # none of the sampled pairs fits: nothing to pack (the stage says so when it runs)
        return None
    with _no_progress_bars():
        rows = reward_packing.pack_pairs(encoded, cfg.seq_len)
    return packing.PackedShape.of(rows, reward_packing.row_width(cfg.seq_len)).conversations_per_row


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    import datasets

    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def _sft_profile(records: list[dict], total: int, tok, template, cfg: StageConfig, packed: bool) -> LengthProfile:
    from medgpt_ray.stages import packing
    from medgpt_ray.stages.conversation_rows import encode_conversations

    encoded, skipped = encode_conversations(records, tok, template, cfg.seq_len, overlong_policy(cfg))
    lengths = [len(x) for x in encoded["input_ids"]]
    per_row = None
    if packed:
        with _no_progress_bars():  # the driver's terminal shows our lines only
            per_row = packing.PackedShape.of(packing.pack(encoded, cfg.seq_len), cfg.seq_len).conversations_per_row
    over = skipped["too_long"] + sum(x >= cfg.seq_len for x in lengths)
    return LengthProfile.of(lengths, total, cfg.seq_len, per_row, over_seq_len=over, sampled=len(records))
