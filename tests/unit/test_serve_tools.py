"""OpenAI's tool calling on `serve` (infer/tool_calls.py): a request's tools and tool turns read into our turns, and
an answer's calls read back out of its text, whole and streamed."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.infer.limits import RequestError, ServeLimits, parse_chat
from medgpt_ray.infer.tool_calls import CallHoldback, ToolRequestError, request_tools, split_calls, tool_turn

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "天气", "parameters": CITY}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京"}}\n</tool_call>'


def test_tools_are_read_as_given_and_a_forced_choice_is_refused():
    assert request_tools({"tools": [WEATHER]}) == [WEATHER]
    assert request_tools({"tools": [WEATHER], "tool_choice": "auto"}) == [WEATHER]
    assert request_tools({"tools": [WEATHER], "tool_choice": "none"}) is None  # no tools in the prompt
    assert request_tools({}) is None and request_tools({"tools": []}) is None
    for body, field in [({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
                        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
                        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]"),
                        ({"tools": "get_weather"}, "tools")]:
        with pytest.raises(ToolRequestError) as e:
            request_tools(body)
        assert e.value.field == field


def test_the_tool_protocol_messages_become_our_turns():
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "北京"}'}}]}
    assert json.loads(tool_turn(1, call)["content"]) == {"name": "get_weather", "arguments": {"city": "北京"}}
    assert tool_turn(1, call)["role"] == "tool_call"
    assert tool_turn(2, {"role": "tool", "tool_call_id": "call_1", "content": "晴"}) == {"role": "tool",
                                                                                         "content": "晴"}
    assert tool_turn(0, {"role": "user", "content": "hi"}) is None
    bad = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}
    with pytest.raises(ToolRequestError) as e:
        tool_turn(3, bad)
    assert e.value.field == "messages[3].tool_calls[0]"
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": "北京天气?"}, call,
                                              {"role": "tool", "content": "晴"}], "tools": [WEATHER]}).encode(),
                     ServeLimits())
    assert [t["role"] for t in req.turns] == ["user", "tool_call", "tool"] and req.tools == [WEATHER]
    with pytest.raises(RequestError) as e:
        parse_chat(json.dumps({"messages": [{"role": "tool", "content": 5}]}).encode(), ServeLimits())
    assert e.value.field == "messages[0].content"


def test_an_answers_calls_are_read_out_of_its_text():
    content, calls = split_calls("我查一下。\n" + CALL + "\n" + CALL.replace("北京", "上海"))
    assert content == "我查一下。" and [c["function"]["name"] for c in calls] == ["get_weather"] * 2
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "北京"}, {"city": "上海"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert split_calls(CALL)[0] is None
    for text in ("no call here", CALL[:-3], CALL + " and then some text", '<tool_call>\n{"city": 1}\n</tool_call>'):
        assert split_calls(text) == (text, [])  # what only looks like a call stays text


@pytest.mark.parametrize("answer", ["好的。" + CALL, "一个 <tool 不是调用的文字", "plain text"])
def test_streamed_text_is_sent_until_a_call_starts_and_nothing_is_lost(answer):
    hold = CallHoldback()
    sent = "".join(hold.feed(ch) for ch in answer)
    rest, calls = hold.finish()
    if "<tool_call>" in answer:
        assert sent == "好的。" and rest == "" and calls[0]["function"]["name"] == "get_weather"
    else:
        assert sent + rest == answer and calls == []
