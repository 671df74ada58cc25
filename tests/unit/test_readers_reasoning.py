"""Readers and reasoning (issue 34): an assistant turn's `reasoning_content` (canonical and ShareGPT turns, and a
preference response given as a turn object) is written into its content as a `<think>` block, so cleaning, PII
redaction and dedup see it as they see the answer; the templates' side is tests/unit/test_templates_families.py."""

from __future__ import annotations

import pytest

from medgpt_ray.data.readers import RecordError, to_canonical


def test_an_assistant_turns_reasoning_becomes_its_think_block_and_is_redacted_with_it() -> None:
    from medgpt_ray.data.ops.pii import ORDER
    from medgpt_ray.data.ops.record import redact_record

    thought = "患者电话13812345678，先排除高血压。"
    turns = [{"role": "user", "content": "头痛三天"},
             {"role": "assistant", "content": "考虑偏头痛。", "reasoning_content": f" {thought} "}]
    [record] = to_canonical({"conversations": turns}, "sft")
    answer = f"<think>\n{thought}\n</think>\n\n考虑偏头痛。"
    assert record["conversations"][1] == {"role": "assistant", "content": answer}
    [same] = to_canonical({"conversations": [  # ShareGPT's turns take the field as well
        {"from": "human", "value": "头痛三天"},
        {"from": "gpt", "value": "考虑偏头痛。", "reasoning_content": "患者电话13812345678，先排除高血压。"}]}, "sft")
    assert same == record
    redacted, counts = redact_record(record, "sft", ORDER)  # the reasoning is content: PII-redacted with it
    assert "13812345678" not in redacted["conversations"][1]["content"] and counts["phone"] == 1
    for bad, reason in (({**turns[1], "reasoning_content": "  "}, "empty turn 2 reasoning_content"),
                        ({**turns[1], "content": "<think>x</think>答", "reasoning_content": "y"}, "both"),
                        ({**turns[1], "reasoning_content": 3}, "turn 2 reasoning_content is a int")):
        with pytest.raises(RecordError, match=reason):
            to_canonical({"conversations": [turns[0], bad]}, "sft")
    pair = {"conversations": turns[:1], "chosen": turns[1], "rejected": {"role": "assistant", "content": "忍着。"}}
    assert to_canonical(pair, "preference")[0]["chosen"] == answer  # a response given as a turn object too
    with pytest.raises(RecordError, match="field 'chosen': both"):
        to_canonical({**pair, "chosen": {**turns[1], "content": "<think>x</think>答"}}, "preference")
    with pytest.raises(RecordError, match="reasoning_content on a user turn"):
        to_canonical({"conversations": [{**turns[0], "reasoning_content": "r"}, turns[1]]}, "sft")
