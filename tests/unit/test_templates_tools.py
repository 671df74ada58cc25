"""Chat templates with tool calling: rendering and masks checked against Qwen2.5-Instruct's own chat template
(tests/fixtures/qwen2_5_chat_template.jinja, shipped verbatim) written into an offline ChatML tokenizer;
templates without a tool format refuse tool records; errors never quote content."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2
import pytest
from transformers import PreTrainedTokenizerFast

from medgpt_ray.templates import (
    IGNORE_INDEX,
    TEMPLATES,
    TemplateError,
    TemplateToolsUnsupported,
    encode_preference,
    encode_sft,
    get_template,
    has_tool_content,
    render_prompt,
)
from tests.unit.template_tokenizers import offline_bpe
from tests.unit.test_templates import CONV, SECRET, _decode, _trained_runs

# --- tool calling (issue 13) -------------------------------------------------------------------
# Qwen2.5-Instruct's own chat template (Qwen/Qwen2.5-7B-Instruct tokenizer_config.json "chat_template"),
# shipped verbatim; copy taken from ggerganov/llama.cpp tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja.
QWEN25_TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "qwen2_5_chat_template.jinja"
QWEN25_SHA256 = "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "检索药品说明书",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "药品名"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_lab_result",
            "description": "Look up a lab result by id",
            "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
        },
    },
]
SYSTEM = {"role": "system", "content": "你是一名全科医生。"}


def _call(*calls: tuple[str, dict]) -> dict:
    """A canonical tool_call turn (one call: an object; several: an array)."""
    objs = [{"name": name, "arguments": args} for name, args in calls]
    return {"role": "tool_call", "content": json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)}


ONE_CALL = [
    {"role": "user", "content": "阿司匹林一天吃多少？"},
    _call(("search", {"query": "阿司匹林"})),
    {"role": "tool", "content": '{"dose": "每日100mg"}'},
    {"role": "assistant", "content": "一般每日100mg。"},
]
PARALLEL_CALLS = [
    {"role": "user", "content": "查一下阿司匹林和化验单3号。"},
    _call(("search", {"query": "阿司匹林"}), ("get_lab_result", {"id": 3})),
    {"role": "tool", "content": '[{"dose": "每日100mg"}, {"ALT": 35}]'},
    {"role": "assistant", "content": "剂量每日100mg，ALT 35 正常。"},
]
MULTI_TURN = [
    {"role": "user", "content": "阿司匹林一天吃多少？"},
    _call(("search", {"query": "阿司匹林"})),
    {"role": "tool", "content": '{"dose": "每日100mg"}'},
    {"role": "assistant", "content": "一般每日100mg。"},
    {"role": "user", "content": "饭前还是饭后？"},
    {"role": "assistant", "content": "饭后服用。"},
]
ENDS_WITH_CALL = [{"role": "user", "content": "查化验单3号。"}, _call(("get_lab_result", {"id": 3}))]
NO_TOOL_TURNS = [{"role": "user", "content": "头痛怎么办？"}, {"role": "assistant", "content": "多休息。"}]

TOOL_CASES = {
    "one_call": ONE_CALL,
    "parallel_calls": PARALLEL_CALLS,
    "multi_turn": MULTI_TURN,
    "ends_with_tool_call": ENDS_WITH_CALL,
    "tools_without_tool_turns": NO_TOOL_TURNS,
}


def _hf_messages(conversation: list[dict]) -> list[dict]:
    """Our turns in HF's convention (written independently of medgpt_ray.templates)."""
    out = []
    for turn in conversation:
        if turn["role"] == "tool_call":
            value = json.loads(turn["content"])
            calls = value if isinstance(value, list) else [value]
            out.append({
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
                ],
            })
        else:
            out.append({"role": turn["role"], "content": turn["content"]})
    return out


def _expected_trained(conversation: list[dict]) -> list[str]:
    """What each trained run must decode to: assistant content / <tool_call> blocks, then <|im_end|>."""
    runs = []
    for turn in conversation:
        if turn["role"] == "assistant":
            runs.append(turn["content"] + "<|im_end|>")
        elif turn["role"] == "tool_call":
            value = json.loads(turn["content"])
            calls = value if isinstance(value, list) else [value]
            blocks = [
                '<tool_call>\n{"name": "' + c["name"] + '", "arguments": '
                + json.dumps(c["arguments"], ensure_ascii=False) + "}\n</tool_call>"
                for c in calls
            ]
            runs.append("\n".join(blocks) + "<|im_end|>")
    return runs


@pytest.fixture(scope="module")
def qwen25() -> PreTrainedTokenizerFast:
    """A ChatML tokenizer (single-token <|im_start|>/<|im_end|>) carrying Qwen2.5-Instruct's own template."""
    tok = offline_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>",
                      pad_token="<|endoftext|>")
    tok.chat_template = QWEN25_TEMPLATE_PATH.read_text(encoding="utf-8")
    return tok


def test_qwen25_fixture_is_the_shipped_template() -> None:
    text = QWEN25_TEMPLATE_PATH.read_text(encoding="utf-8")
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == QWEN25_SHA256
    assert "You may call one or more functions to assist with the user query." in text
    assert "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." in text


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no_tools"])
@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_tool_conversation_matches_qwen25_and_trains_only_calls_and_answers(
    case: str, with_tools: bool, qwen25: PreTrainedTokenizerFast
) -> None:
    conv = [SYSTEM, *TOOL_CASES[case]]
    tools = TOOLS if with_tools else None
    tok, tpl = qwen25, get_template("qwen")
    out = encode_sft(tok, tpl, conv, tools=tools)
    ids, labels = out["input_ids"], out["labels"]
    text = _decode(tok, ids)
    # (a) byte-identical to Qwen2.5-Instruct's own template when the conversation has a system turn
    assert text == tok.apply_chat_template(_hf_messages(conv), tools=tools, tokenize=False)
    # ... and to our exported jinja (what apply_to_tokenizer saves), masks included
    ours = tok.apply_chat_template(
        _hf_messages(conv), tools=tools, chat_template=tpl.jinja, tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert _decode(tok, list(ours["input_ids"])) == text
    assert list(ours["input_ids"]) == ids
    assert list(ours["assistant_masks"]) == [int(label != IGNORE_INDEX) for label in labels]
    # (b) trained runs are exactly the assistant answers and the <tool_call> blocks, each + <|im_end|>
    assert all(label in (IGNORE_INDEX, i) for i, label in zip(ids, labels, strict=True))
    runs = _trained_runs(labels)
    assert [_decode(tok, ids[a:b]) for a, b in runs] == _expected_trained(conv)
    trained_text = _decode(tok, [i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
    assert "tool_response" not in trained_text and "# Tools" not in trained_text and "<tools>" not in trained_text
    for turn in conv:
        if turn["role"] in ("system", "user", "tool"):
            assert turn["content"] not in trained_text
    for tool in TOOLS:
        assert json.dumps(tool, ensure_ascii=False) not in trained_text
    # (c) the schemas are in the prompt, inside the system turn
    system_turn = text[: text.index("<|im_start|>user")]
    for tool in TOOLS:
        assert (json.dumps(tool, ensure_ascii=False) in system_turn) is with_tools
    assert system_turn.startswith("<|im_start|>system\n" + SYSTEM["content"])


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_tools_without_system_turn_hold_only_the_tools_block(case: str, qwen25: PreTrainedTokenizerFast) -> None:
    tok, tpl = qwen25, get_template("chatml")
    conv = TOOL_CASES[case]
    text = _decode(tok, encode_sft(tok, tpl, conv, tools=TOOLS)["input_ids"])
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert "You are Qwen" not in text
    # Qwen2.5 with an empty system turn renders "system\n" + "" + "\n\n# Tools"; we drop that "\n\n"
    qwen_empty_system = tok.apply_chat_template(
        _hf_messages([{"role": "system", "content": ""}, *conv]), tools=TOOLS, tokenize=False
    )
    assert qwen_empty_system.startswith("<|im_start|>system\n\n\n# Tools")
    assert text == qwen_empty_system.replace("<|im_start|>system\n\n\n", "<|im_start|>system\n", 1)
    assert text == tok.apply_chat_template(_hf_messages(conv), tools=TOOLS, chat_template=tpl.jinja, tokenize=False)
    # no tools and no system turn: nothing is injected (unchanged behaviour)
    if not any(t["role"] in ("tool_call", "tool") for t in conv):
        plain = _decode(tok, encode_sft(tok, tpl, conv)["input_ids"])
        assert plain.startswith("<|im_start|>user\n")


@pytest.mark.parametrize("with_system", [True, False], ids=["system", "no_system"])
def test_render_prompt_after_tool_result_matches_generation_prompt(
    with_system: bool, qwen25: PreTrainedTokenizerFast
) -> None:
    tok, tpl = qwen25, get_template("qwen")
    turns = ([SYSTEM] if with_system else []) + MULTI_TURN[:3]  # ends with the tool's result
    prompt = render_prompt(tpl, tok, turns, tools=TOOLS)
    assert prompt.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    hf_kwargs = {"tools": TOOLS, "tokenize": False, "add_generation_prompt": True}
    if with_system:  # (d) Qwen2.5's own template
        assert prompt == tok.apply_chat_template(_hf_messages(turns), **hf_kwargs)
    assert prompt == tok.apply_chat_template(_hf_messages(turns), chat_template=tpl.jinja, **hf_kwargs)
    # a tool_call continuation prompt, and the same prompt through encode_preference
    record = {"conversations": turns, "chosen": "一般每日100mg。", "rejected": "不知道。", "tools": TOOLS}
    enc = encode_preference(tok, tpl, record)
    assert _decode(tok, enc["prompt_ids"]) == prompt
    assert _decode(tok, enc["chosen_ids"]) == "一般每日100mg。<|im_end|>"
    # tools change the prompt; without them the system turn has no tools block
    assert "# Tools" not in render_prompt(tpl, tok, turns)


def test_our_jinja_merges_consecutive_tool_results_like_qwen25(qwen25: PreTrainedTokenizerFast) -> None:
    # Hand-built HF chats may answer parallel calls with one tool message per call (our records hold one)
    messages = [
        *_hf_messages([SYSTEM, PARALLEL_CALLS[0], PARALLEL_CALLS[1]]),
        {"role": "tool", "content": '{"dose": "每日100mg"}'},
        {"role": "tool", "content": '{"ALT": 35}'},
        {"role": "assistant", "content": "好的。"},
    ]
    for gen in (False, True):
        qwen = qwen25.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=gen)
        ours = qwen25.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=gen, chat_template=TEMPLATES["chatml"].jinja
        )
        assert ours == qwen
    # an assistant message with text before its calls renders the Qwen2.5 way too
    mixed = [SYSTEM, {"role": "user", "content": "查一下"}, {**messages[2], "content": "我来查。"}]
    assert qwen25.apply_chat_template(mixed, tools=TOOLS, tokenize=False) == qwen25.apply_chat_template(
        mixed, tools=TOOLS, tokenize=False, chat_template=TEMPLATES["chatml"].jinja
    )


def test_tool_call_string_arguments_are_canonicalised(qwen25: PreTrainedTokenizerFast) -> None:
    tpl = get_template("chatml")
    as_string = {"role": "tool_call", "content": json.dumps({"name": "search", "arguments": '{"query": "阿司匹林"}'})}
    conv = [ONE_CALL[0], as_string]
    assert encode_sft(qwen25, tpl, conv) == encode_sft(qwen25, tpl, ONE_CALL[:2])


@pytest.mark.parametrize("name", ["llama3", "vicuna", "alpaca"])
def test_templates_without_tool_format_refuse_tool_records(name: str, toks: dict) -> None:
    tok, tpl = toks[name], get_template(name)
    expected = (
        f"template '{name}' has no tool-calling format; records with tools or tool turns cannot be rendered with it"
    )
    sft_cases = [(NO_TOOL_TURNS, TOOLS), (ONE_CALL, None), (ENDS_WITH_CALL, [])]
    for conv, tools in sft_cases:
        with pytest.raises(TemplateToolsUnsupported) as err:
            encode_sft(tok, tpl, conv, tools=tools)
        assert str(err.value) == expected and isinstance(err.value, TemplateError)
    for turns, tools in [(CONV[1:2], TOOLS), (ONE_CALL[:3], None)]:
        with pytest.raises(TemplateToolsUnsupported, match=f"'{name}'"):
            render_prompt(tpl, tok, turns, tools=tools)
        record = {"conversations": turns, "chosen": "a", "rejected": "b", "tools": tools}
        with pytest.raises(TemplateToolsUnsupported, match=f"'{name}'"):
            encode_preference(tok, tpl, record)
    # the exported jinja refuses them too instead of rendering tool turns as something else
    for conv, tools in [(CONV[1:3], TOOLS), (ENDS_WITH_CALL, None), (ONE_CALL, None)]:
        with pytest.raises(jinja2.TemplateError, match="no tool-calling format"):
            tok.apply_chat_template(_hf_messages(conv), tools=tools, chat_template=tpl.jinja, tokenize=False)
    # records without tools are unaffected
    assert encode_sft(tok, tpl, CONV, tools=[]) == encode_sft(tok, tpl, CONV)


def test_has_tool_content() -> None:
    assert not has_tool_content(CONV, None) and not has_tool_content(CONV, [])
    assert has_tool_content(CONV, TOOLS)
    assert has_tool_content(ONE_CALL, None) and has_tool_content(ENDS_WITH_CALL, [])
    assert not has_tool_content(None, None)


SECRET_CALL = _call(("search", {"q": SECRET}))


@pytest.mark.parametrize(
    "conv, last, match",
    [
        ([{"role": "tool", "content": SECRET}], "user", "turn 1: a tool turn must directly follow a tool_call"),
        (
            [{"role": "user", "content": SECRET}, {"role": "tool", "content": SECRET}],
            "user",
            "turn 2: a tool turn must directly follow a tool_call turn",
        ),
        (
            [{"role": "user", "content": SECRET}, SECRET_CALL, {"role": "user", "content": SECRET}],
            "user",
            "turn 2: a tool_call turn must be followed by a tool turn",
        ),
        (
            [
                {"role": "user", "content": SECRET},
                {"role": "assistant", "content": SECRET},
                {"role": "tool", "content": SECRET},
            ],
            "user",
            "turn 3: a tool turn must directly follow a tool_call turn",
        ),
        (
            [{"role": "user", "content": SECRET}, SECRET_CALL, {"role": "tool", "content": SECRET}],
            "assistant",
            "conversation must end with an assistant turn, ends with tool",
        ),
        ([{"role": "user", "content": SECRET}, SECRET_CALL], "user", "prompt must end with a user turn"),
        (
            [{"role": "user", "content": SECRET}, {"role": "tool_call", "content": SECRET}],
            "assistant",
            r"turn 2 \(tool_call\): content must be a JSON",
        ),
        (
            [{"role": "user", "content": SECRET}, {"role": "tool_call", "content": json.dumps({"name": SECRET})}],
            "assistant",
            r"turn 2 \(tool_call\)",
        ),
        (
            [{"role": "user", "content": SECRET}, {"role": "tool_call", "content": "[]"}],
            "assistant",
            r"turn 2 \(tool_call\)",
        ),
    ],
)
def test_tool_order_and_shape_errors_never_quote_content(conv: list, last: str, match: str, toks: dict) -> None:
    tok, tpl = toks["chatml"], get_template("chatml")
    with pytest.raises(TemplateError, match=match) as err:
        if last == "assistant":
            encode_sft(tok, tpl, conv)
        else:
            render_prompt(tpl, tok, conv)
    assert SECRET not in str(err.value)


def test_tools_must_be_a_list_of_objects(toks: dict) -> None:
    tok, tpl = toks["chatml"], get_template("chatml")
    for bad in ('[{"type": "function"}]', [SECRET], {"name": "x"}):
        with pytest.raises(TemplateError, match="tools must be a list") as err:
            encode_sft(tok, tpl, NO_TOOL_TURNS, tools=bad)
        assert SECRET not in str(err.value)
    with pytest.raises(TemplateError, match="tools must be a list"):
        encode_preference(tok, tpl, {"conversations": CONV[1:2], "chosen": "a", "rejected": "b", "tools": "x"})
