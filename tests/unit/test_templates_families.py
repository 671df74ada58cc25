"""Templates from the model's own tokenizer (issue 34, item 4): the Jinja families (qwen3, qwen3_5, glm4, mistral,
their *_nothink names) and ``auto`` (the tokenizer's own template: Llama 3, GLM-4.5, Qwen2.5, Qwen3 as TRL bundles
them). For each, on a rendered multi-turn conversation, the loss mask covers exactly the assistant turns' tokens and
their end-of-turn token, computed here independently of the code under test: each answer is located in the rendered
text, its span (what the model writes, up to and with the end-of-turn literal of that family) is mapped to tokens
through the tokenizer's offsets. Earlier turns encode the same as in the full conversation.

Tokenizers are built offline (tests/unit/template_tokenizers.py), with each family's control tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trl.chat_template_utils import glm4moe_chat_template, llama3_chat_template, qwen3_chat_template

from medgpt_ray.generation.prompts import stop_token_ids
from medgpt_ray.templates import (
    AUTO,
    IGNORE_INDEX,
    TemplateError,
    TemplateTokenizerMismatch,
    TemplateToolsUnsupported,
    apply_to_tokenizer,
    encode_preference,
    encode_sft,
    get_template,
    render_prompt,
    resolve,
    template_names,
)
from tests.unit.template_tokenizers import offline_bpe
from tests.unit.test_templates import CONV
from tests.unit.test_templates_tools import ONE_CALL, TOOLS

QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
GLM = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>",
       "<|endoftext|>"]
QWEN25_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen2_5_chat_template.jinja"


def _tok(family: str, chat_template: str | None = None):
    if family == "qwen":
        tok = offline_bpe(QWEN, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    elif family == "glm":
        tok = offline_bpe(GLM, eos_token="<|endoftext|>")
    elif family == "llama3":
        tok = offline_bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"], bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    else:
        tok = offline_bpe(["<s>", "</s>", "[INST]", "[/INST]"], bos_token="<s>", eos_token="</s>")
    tok.chat_template = chat_template
    return tok


# (case, tokenizer family, its shipped template, template name, end-of-turn literal, what the model writes before
# an answer's content that the generation prompt does not give)
CASES = [
    ("qwen3", "qwen", None, "qwen3", "<|im_end|>", ""),
    ("qwen3_5", "qwen", None, "qwen3_5", "<|im_end|>", ""),
    ("qwen3_nothink", "qwen", None, "qwen3_nothink", "<|im_end|>", ""),
    ("qwen3_5_nothink", "qwen", None, "qwen3_5_nothink", "<|im_end|>", ""),
    ("glm4", "glm", None, "glm4", "<|user|>", ""),
    ("mistral", "mistral", None, "mistral", "</s>", ""),
    ("auto: Qwen3's own", "qwen", qwen3_chat_template, "auto", "<|im_end|>", ""),
    ("auto: Qwen2.5's own", "qwen", QWEN25_FIXTURE.read_text(encoding="utf-8"), "auto", "<|im_end|>", ""),
    ("auto: Llama 3's own", "llama3", llama3_chat_template, "auto", "<|eot_id|>", ""),
    ("auto: GLM-4.5's own", "glm", glm4moe_chat_template, "auto", "<|user|>", "\n"),
]


def _expected(tok, text: str, answers: list[str], eot: str, lead: str) -> list[bool]:
    """Token i is trained iff it lies in some answer's span: lead + content + end-of-turn literal."""
    spans, pos = [], 0
    for answer in answers:
        start = text.index(lead + answer, pos)
        end = start + len(lead + answer)
        assert text[end:end + len(eot)] == eot, "the family's end-of-turn literal directly follows the answer"
        spans.append((start, end + len(eot)))
        pos = end
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [any(a <= s and e <= b for a, b in spans) for s, e in offsets]


@pytest.mark.parametrize("case, family, shipped, name, eot, lead", CASES, ids=[c[0] for c in CASES])
def test_mask_is_exactly_the_answers_and_their_end_of_turn(case, family, shipped, name, eot, lead) -> None:
    tok, tpl = _tok(family, shipped), get_template(name)
    out = encode_sft(tok, tpl, CONV)
    ids, labels = out["input_ids"], out["labels"]
    assert all(label in (IGNORE_INDEX, i) for i, label in zip(ids, labels, strict=True))
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert tok(text, add_special_tokens=False)["input_ids"] == ids  # one text, tokenized whole
    answers = [t["content"] for t in CONV if t["role"] == "assistant"]
    assert [label != IGNORE_INDEX for label in labels] == _expected(tok, text, answers, eot, lead)
    for turn in CONV:  # the system and user turns are in the text, never trained
        assert turn["content"] in text
    # earlier turns encode the same as in the full conversation (ids and labels), for every cut after an answer
    for k in (3, 5):
        head = encode_sft(tok, tpl, CONV[:k])
        n = len(head["input_ids"])
        assert head["input_ids"] == ids[:n] and head["labels"] == labels[:n]


def test_qwen3_own_template_rerenders_earlier_turns_so_the_training_variant_is_used() -> None:
    """Why masks never come from rendering with and without each turn: Qwen3's shipped template renders an answer
    with its <think> block only while it is the last one."""
    tok = _tok("qwen", qwen3_chat_template)
    short = tok.apply_chat_template(CONV[:3], tokenize=False, enable_thinking=False)
    full = tok.apply_chat_template(CONV, tokenize=False, enable_thinking=False)
    assert not full.startswith(short)
    assert resolve(AUTO, tok).training != qwen3_chat_template


def test_qwen3_thinking_follows_the_record() -> None:
    tok = _tok("qwen")
    plain = encode_sft(tok, get_template("qwen3_5"), CONV[:3])
    text = tok.decode(plain["input_ids"])
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n建议测量血压。" in text  # non-thinking, as Qwen3 expects
    trained = tok.decode([i for i in plain["labels"] if i != IGNORE_INDEX])
    assert trained == "建议测量血压。<|im_end|>"  # the empty block is the prompt's, as at inference
    reasoning = [*CONV[:2], {**CONV[2], "reasoning_content": "血压需要先测。"}]
    for name, prompt_gives in (("qwen3", ""), ("qwen3_5", "<think>\n")):
        out = encode_sft(tok, get_template(name), reasoning)
        text = tok.decode(out["input_ids"])
        trained = tok.decode([i for i in out["labels"] if i != IGNORE_INDEX])
        thought = "<think>\n血压需要先测。\n</think>\n\n建议测量血压。<|im_end|>"
        assert thought in text and trained == thought[len(prompt_gives):]
    dropped = encode_sft(tok, get_template("qwen3_nothink"), reasoning)
    assert dropped == plain and "血压需要先测" not in tok.decode(dropped["input_ids"])
    prompt = render_prompt(get_template("qwen3"), tok, CONV[:2])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_read_records_reasoning_encodes_as_the_templates_own_reasoning() -> None:
    """The readers write an assistant turn's reasoning_content into its content as a <think> block
    (data/fields.py): under Qwen3's and Qwen3.5's templates that encodes token for token as the field itself."""
    from medgpt_ray.data.readers import to_canonical

    tok = _tok("qwen")
    turns = [*CONV[:2], {**CONV[2], "reasoning_content": "血压需要先测。"}]
    [record] = to_canonical({"conversations": turns}, "sft")
    assert "reasoning_content" not in record["conversations"][2]
    for name in ("qwen3", "qwen3_5"):
        assert encode_sft(tok, get_template(name), record["conversations"]) == \
            encode_sft(tok, get_template(name), turns)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "glm4", "mistral"])
def test_preference_and_prompt_agree_with_the_sft_mask(name: str) -> None:
    family = {"glm4": "glm", "mistral": "mistral"}.get(name, "qwen")
    tok, tpl = _tok(family), get_template(name)
    record = {"conversations": CONV[:4], "chosen": "建议复查血压。", "rejected": "不用管。"}
    pref = encode_preference(tok, tpl, record)
    assert tok.decode(pref["prompt_ids"]) == render_prompt(tpl, tok, CONV[:4])
    sft = encode_sft(tok, tpl, [*CONV[:4], {"role": "assistant", "content": record["chosen"]}])
    n = len(pref["prompt_ids"])
    assert sft["input_ids"][:n] == pref["prompt_ids"]
    assert [i for i in sft["labels"][n:] if i != IGNORE_INDEX] == pref["chosen_ids"]
    eot = tok.convert_tokens_to_ids({"glm4": "<|user|>", "mistral": "</s>"}.get(name, "<|im_end|>"))
    assert pref["chosen_ids"][-1] == eot and eot in stop_token_ids(tok, tpl)


def test_tool_calls_through_the_templates_own_tools() -> None:
    tok = _tok("qwen")
    out = encode_sft(tok, get_template("qwen3"), ONE_CALL, tools=TOOLS)
    text = tok.decode(out["input_ids"])
    trained = tok.decode([i for i in out["labels"] if i != IGNORE_INDEX])
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "阿司匹林"}}\n</tool_call><|im_end|>'
    assert "# Tools" in text and '"name": "get_lab_result"' in text
    assert "<tool_response>\n" + ONE_CALL[2]["content"] + "\n</tool_response>" in text
    assert trained == call + "一般每日100mg。<|im_end|>"
    xml = encode_sft(tok, get_template("qwen3_5"), ONE_CALL, tools=TOOLS)  # Qwen3.5's own XML call format
    trained = tok.decode([i for i in xml["labels"] if i != IGNORE_INDEX])
    assert trained.startswith("<tool_call>\n<function=search>\n<parameter=query>\n阿司匹林\n</parameter>")
    assert trained.endswith("</tool_call><|im_end|>一般每日100mg。<|im_end|>")
    for name, family in (("glm4", "glm"), ("mistral", "mistral")):
        with pytest.raises(TemplateToolsUnsupported):
            encode_sft(_tok(family), get_template(name), ONE_CALL, tools=TOOLS)


def test_auto_resolution_and_errors() -> None:
    bare = _tok("qwen")
    assert resolve(AUTO, bare) is get_template("chatml")  # no shipped template: today's default
    bare.chat_template = qwen3_chat_template  # a template written into it later is what auto follows
    assert resolve(AUTO, bare).jinja == qwen3_chat_template
    saved = _tok("qwen")
    apply_to_tokenizer(get_template("chatml"), saved)
    assert resolve(AUTO, saved) is get_template("chatml")  # a run's saved chatml: the same segment encoder
    assert resolve(AUTO, _tok("glm", get_template("glm4").jinja)).training == get_template("glm4").training
    unmarked = _tok("qwen", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(TemplateTokenizerMismatch, match="generation") as err:
        encode_sft(unmarked, AUTO, CONV)
    assert "qwen3_5_nothink" in str(err.value)
    with pytest.raises(TemplateError) as err:
        get_template("chatglm")
    for name in template_names():
        assert name in str(err.value)
    assert {"auto", "qwen", "qwen3", "qwen3_nothink", "qwen3_5", "qwen3_5_nothink", "llama3", "glm4", "mistral",
            "vicuna", "alpaca", "chatml"} <= set(template_names())
    with pytest.raises(TemplateTokenizerMismatch):
        encode_sft(_tok("mistral"), get_template("qwen3"), CONV)


def test_saved_tokenizer_keeps_the_shipped_template() -> None:
    tok = _tok("qwen")
    apply_to_tokenizer(get_template("qwen3"), tok)
    assert tok.chat_template == qwen3_chat_template  # what users chat with, not the training variant
    assert encode_sft(tok, AUTO, CONV) == encode_sft(tok, get_template("qwen3"), CONV)
