"""Records longer than seq_len (stages/overlong.py, issue 36): the rule per kind on encoded records with the tiny
tokenizer — sft cut at a turn boundary and never inside a tools block or an answer's first tokens, pairs keeping
their prompt, prompts keeping their end, `skip` leaving them out — and the counts, the 99 % seq_len and the warning."""

from __future__ import annotations

import pytest

from medgpt_ray.config import ConfigError, PipelineConfig, load_config
from medgpt_ray.stages.overlong import ANSWER_FLOOR, LengthTally, conversation_cut, warning_line

IGNORE = -100
END = "<|im_end|>"


def labels(*runs: tuple[int, bool]) -> list[int]:
    """Labels of runs of (length, trained)."""
    return [x for n, trained in runs for x in ([1] * n if trained else [IGNORE] * n)]


def test_a_conversation_is_cut_at_a_turn_boundary_or_past_an_answers_first_tokens():
    talk = labels((10, False), (20, True), (5, False), (30, True))  # prompt, answer 1 [10, 30), user, answer 2 [35, 65)
    assert conversation_cut(talk, 34) == 30  # inside the user turn: back to answer 1's end
    assert conversation_cut(talk, 35 + ANSWER_FLOOR - 1) == 30  # answer 2's first tokens only: not cut there
    assert conversation_cut(talk, 35 + ANSWER_FLOOR) == 35 + ANSWER_FLOOR  # past them: answer 2 cut at its tail
    assert conversation_cut(talk, 35 + ANSWER_FLOOR, whole_only=[False, True]) == 30  # a tool call is never halved
    assert conversation_cut(talk, 10 + ANSWER_FLOOR) == 10 + ANSWER_FLOOR
    assert conversation_cut(talk, 10 + ANSWER_FLOOR - 1) is None  # the prompt leaves no room for answer 1: skipped


@pytest.fixture(scope="module")
def tok(tiny_model):
    from medgpt_ray import models

    return models.load_tokenizer(tiny_model)


def chatml():
    from medgpt_ray import templates

    return templates.get_template("chatml")


TOOLS = [{"type": "function", "function": {"name": "query_drug_info", "description": "药品说明书" * 60,
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_sft_truncates_at_turn_boundaries_skips_a_long_tools_block_and_counts_both(tok):
    from medgpt_ray.stages.conversation_rows import encode_conversations

    def turns(*texts: str) -> list[dict]:
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]

    short = {"conversations": turns("头痛", "多久了？")}
    long_second = {"conversations": turns("头痛三天", "挂神经科。", "还有呢" * 80, "好")}
    tools_block = {"conversations": turns("布洛芬", "每次一片"), "tools": TOOLS}
    seq_len = 128
    ds, counts = encode_conversations([short, long_second, tools_block], tok, chatml(), seq_len)
    tally = counts["overlong"]
    assert (tally.records, tally.truncated, tally.skipped, len(ds)) == (3, 1, 1, 2)
    cut = ds[1]
    assert len(cut["input_ids"]) <= seq_len and tok.decode(cut["input_ids"]).endswith("挂神经科。" + END)
    assert cut["labels"][-1] != IGNORE  # ends on the first answer's end of turn, not inside the long user turn
    assert counts["too_long"] == 1  # the tools block alone is longer than seq_len: skipped, never cut inside
    assert tally.keep_seq_len() > seq_len and max(tally.over_lengths) > seq_len

    _, skipped = encode_conversations([short, long_second, tools_block], tok, chatml(), seq_len, "skip")
    assert (skipped["overlong"].truncated, skipped["overlong"].skipped) == (0, 2)


def test_pairs_keep_their_prompt_and_prompts_keep_their_end(tok):
    from medgpt_ray.stages.online_rl import prompt_rows
    from medgpt_ray.stages.preference_rows import preference_texts

    q = [{"role": "user", "content": "头痛怎么办？"}]
    pairs = [{"conversations": q, "chosen": "休息" * 100, "rejected": "不管"},  # a long response: cut at its tail
             {"conversations": [{"role": "user", "content": "头痛" * 100}], "chosen": "休息", "rejected": "不管"},
             {"conversations": q, "chosen": "休息", "rejected": "不管"}]
    ds, counts = preference_texts(pairs, tok, chatml(), 96)
    assert (counts["overlong"].truncated, counts["overlong"].skipped, len(ds)) == (1, 1, 2)  # the long prompt: out
    assert ds["chosen"][0] == "休息" * 100 + END  # whole text: TRL cuts it to max_length, keeping the prompt
    assert preference_texts(pairs, tok, chatml(), 96, "skip")[1]["overlong"].skipped == 2

    prompts = [{"conversations": [{"role": "system", "content": "你是医生"}, {"role": "user", "content": "头痛" * 80}],
                "answer": "A"}, {"conversations": q, "answer": "B"}]
    rows, counted = prompt_rows(prompts, tok, chatml(), 96, 32)
    assert (counted["overlong"].truncated, counted["overlong"].skipped, len(rows)) == (1, 0, 2)
    kept = rows["prompt"][0]
    assert "你是医生" not in kept and kept.endswith("<|im_start|>assistant\n")  # left truncation: the end kept
    assert len(tok(kept, add_special_tokens=False)["input_ids"]) <= 96 - 32
    assert prompt_rows(prompts, tok, chatml(), 96, 32, "skip")[1]["overlong"].skipped == 1


def test_counts_merge_over_workers_and_name_the_seq_len_keeping_99_percent():
    def shard(over: list[int], fitting: int) -> dict:
        t = LengthTally(512, "truncate", "conversations", "conversations")
        for n in over:
            t.add(n, "truncated" if n < 2000 else "skipped")
        for _ in range(fitting):
            t.add(100, "kept")
        return t.state()

    # 200 records, 14 over seq_len: 7 %; the 99th percentile is the 198th length: the third longest
    tally = LengthTally.merged([shard([600, 700, 800, 900, 1000, 1100, 2500], 93),
                                shard([650, 750, 850, 950, 1050, 1150, 3000], 93)])
    summary = tally.to_dict()
    assert (summary["records"], summary["truncated"], summary["skipped"]) == (200, 12, 2)
    assert summary["keep_99_seq_len"] == 1150 and "over_lengths" not in summary  # counts only, no record's length
    line = warning_line("sft", summary)
    assert line is not None and "14 of 200 conversations (7 %)" in line and "seq_len 1,150 would keep 99 %" in line
    ten = LengthTally.merged([shard([600] * 10, 190)]).to_dict()  # 5 % exactly: no warning
    assert warning_line("sft", ten) is None and ten["keep_99_seq_len"] == 600
    assert LengthTally.merged([shard([600], 199)]).to_dict()["keep_99_seq_len"] == 512  # 99 % fit already
    # one 5 MB record among 18: no seq_len of 873,845 is suggested; the warning names it an outlier
    outlier = warning_line("sft", LengthTally.merged([shard([873_845], 18)]).to_dict())
    assert outlier is not None and "873,845" not in outlier and "outliers" in outlier and "overlong: skip" in outlier
    # with the model's context known: 99 % whole would need more than it reads, and the warning counts what a
    # seq_len of the whole context would still cut (the 873,845-token record), instead of suggesting a seq_len
    capped = LengthTally.merged([shard([873_845], 18)]).to_dict(context=32_768)
    assert (capped["model_context"], capped["over_context"]) == (32_768, 1)
    line = warning_line("sft", capped)
    assert "model's context as seq_len (32,768 tokens) would still cut 1 of them" in line and "873,845" not in line
    assert warning_line("sft", tally.to_dict(context=32_768)) == warning_line("sft", summary)  # 1,150 fits in it


def test_the_key_is_validated_and_pt_has_none(tmp_path):
    ok = PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": {"sft": {"overlong": "skip"}}})
    assert ok.stages.get("sft").overlong == "skip" and ok.stages.get("dpo").overlong == "truncate"
    bad = tmp_path / "c.yaml"
    bad.write_text("model: {path: tiny}\nstages:\n  sft: {overlong: cut}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="overlong"):
        load_config(bad)
    bad.write_text("model: {path: tiny}\nstages:\n  pt: {overlong: skip}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="overlong"):  # pt packs into blocks: nothing to choose
        load_config(bad)
