"""Chat templates: exact response-only masks, rendering parity with HF chat templates, errors.

Tokenizers are built offline (tests/unit/template_tokenizers.py; the `toks` fixture in tests/unit/conftest.py).
Tool-calling conversations are in test_templates_tools.py.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from medgpt_ray.templates import (
    IGNORE_INDEX,
    TEMPLATES,
    ChatTemplate,
    TemplateError,
    TemplateTokenizerMismatch,
    apply_to_tokenizer,
    check_template,
    encode_preference,
    encode_sft,
    get_template,
    render_prompt,
    resolved_suffix,
    response_text,
)
from tests.unit.template_tokenizers import offline_bpe

CONV = [
    {"role": "system", "content": "你是一名全科医生。"},
    {"role": "user", "content": "头痛三天怎么办？"},
    {"role": "assistant", "content": "建议测量血压。"},
    {"role": "user", "content": "血压偏高呢？"},
    {"role": "assistant", "content": "低盐饮食，规律服药。"},
    {"role": "user", "content": "需要复查吗？"},
    {"role": "assistant", "content": "Yes, every month."},
]
ASSISTANT = [t["content"] for t in CONV if t["role"] == "assistant"]


def _decode(tok: PreTrainedTokenizerFast, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _trained_runs(labels: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_registry_and_unknown_name() -> None:
    assert set(TEMPLATES) == {"chatml", "qwen", "llama3", "vicuna", "alpaca"}
    assert get_template("qwen") is get_template("chatml")
    with pytest.raises(TemplateError) as err:
        get_template("chatglm")
    for name in ("alpaca", "chatml", "llama3", "qwen", "vicuna"):
        assert name in str(err.value)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_assistant_turn_trained_exactly(name: str, toks: dict) -> None:
    tok, tpl = toks[name], get_template(name)
    check_template(tpl, tok)
    out = encode_sft(tok, tpl, CONV)
    ids, labels = out["input_ids"], out["labels"]
    assert len(labels) == len(ids) == len(out["attention_mask"])
    assert all(m == 1 for m in out["attention_mask"])
    suffix = resolved_suffix(tpl, tok)
    assert suffix  # every template ends a turn with a trained token
    trained = [i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    assert all(label in (IGNORE_INDEX, i) for i, label in zip(ids, labels, strict=True))
    assert _decode(tok, trained) == "".join(a + suffix for a in ASSISTANT)
    runs = _trained_runs(labels)
    assert len(runs) == len(ASSISTANT)
    for (a, b), content in zip(runs, ASSISTANT, strict=True):
        assert _decode(tok, ids[a:b]) == content + suffix
    trained_text = _decode(tok, trained)
    for turn in CONV:
        if turn["role"] != "assistant":
            assert turn["content"] not in trained_text
    # the whole sequence decodes to the same text the exported HF chat template renders
    assert _decode(tok, ids) == tok.apply_chat_template(CONV, chat_template=tpl.jinja, tokenize=False)
    if tpl.bos:
        assert ids[0] == tok.bos_token_id and labels[0] == IGNORE_INDEX


def test_chatml_exact_rendering_and_hf_assistant_mask(toks: dict) -> None:
    tok, tpl = toks["chatml"], get_template("chatml")
    conv = CONV[:5]
    expected = (
        "<|im_start|>system\n你是一名全科医生。<|im_end|>\n"
        "<|im_start|>user\n头痛三天怎么办？<|im_end|>\n"
        "<|im_start|>assistant\n建议测量血压。<|im_end|>\n"
        "<|im_start|>user\n血压偏高呢？<|im_end|>\n"
        "<|im_start|>assistant\n低盐饮食，规律服药。<|im_end|>\n"
    )
    out = encode_sft(tok, tpl, conv)
    assert _decode(tok, out["input_ids"]) == expected
    apply_to_tokenizer(tpl, tok)
    assert tok.apply_chat_template(conv, tokenize=False) == expected
    hf = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    # chatml's segment boundaries sit on special tokens / newlines, so whole-text tokenization agrees
    assert list(hf["input_ids"]) == out["input_ids"]
    assert list(hf["assistant_masks"]) == [int(label != IGNORE_INDEX) for label in out["labels"]]


def test_vicuna_and_alpaca_shape(toks: dict) -> None:
    conv = [{"role": "user", "content": "头痛"}, {"role": "assistant", "content": "休息"}]
    vicuna = _decode(toks["vicuna"], encode_sft(toks["vicuna"], get_template("vicuna"), conv)["input_ids"])
    assert vicuna == "<s>" + TEMPLATES["vicuna"].default_system + " USER: 头痛 ASSISTANT:休息</s>"
    alpaca = _decode(toks["alpaca"], encode_sft(toks["alpaca"], get_template("alpaca"), conv)["input_ids"])
    assert alpaca.endswith("request.\n\n### Instruction:\n头痛\n\n### Response:\n休息</s>\n\n")
    # chatml has no default system: nothing is injected
    chatml = _decode(toks["chatml"], encode_sft(toks["chatml"], get_template("chatml"), conv)["input_ids"])
    assert chatml.startswith("<|im_start|>user\n")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_render_prompt_matches_generation_prompt(name: str, toks: dict) -> None:
    tok, tpl = toks[name], get_template(name)
    turns = CONV[1:4]  # no system: the template default (if any) is used
    prompt = render_prompt(tpl, tok, turns)
    assert prompt.endswith(tpl.assistant_prefix)
    hf = tok.apply_chat_template(turns, chat_template=tpl.jinja, tokenize=False, add_generation_prompt=True)
    assert prompt == hf
    if tpl.default_system:
        assert tpl.default_system in prompt
    assert response_text(tpl, tok, "好的") == "好的" + resolved_suffix(tpl, tok)


def test_truncation_keeps_start_and_never_leaves_nothing_trained(toks: dict) -> None:
    tok, tpl = toks["chatml"], get_template("chatml")
    full = encode_sft(tok, tpl, CONV)
    first_trained = next(i for i, label in enumerate(full["labels"]) if label != IGNORE_INDEX)
    second_run = _trained_runs(full["labels"])[1]
    cut = second_run[0] + 2  # inside the second answer
    out = encode_sft(tok, tpl, CONV, max_len=cut)
    assert out["input_ids"] == full["input_ids"][:cut] and out["labels"] == full["labels"][:cut]
    assert len(out["attention_mask"]) == cut
    one = encode_sft(tok, tpl, CONV, max_len=first_trained + 1)
    assert sum(label != IGNORE_INDEX for label in one["labels"]) == 1
    with pytest.raises(TemplateError, match="no trained token"):
        encode_sft(tok, tpl, CONV, max_len=first_trained)
    assert encode_sft(tok, tpl, CONV, max_len=10_000) == full


SECRET = "患者身份证号SECRET"


@pytest.mark.parametrize(
    "conv, match",
    [
        ([], "non-empty"),
        ([{"role": "system", "content": SECRET}], "no user turn"),
        ([{"role": "user", "content": SECRET}], "must end with an assistant turn"),
        ([{"role": "assistant", "content": SECRET}], "turn 1: expected user, got assistant"),
        ([{"role": "user", "content": SECRET}, {"role": "user", "content": SECRET}], "turn 2"),
        (
            [{"role": "user", "content": SECRET}, {"role": "system", "content": SECRET}],
            "turn 2: a system turn is only allowed first",
        ),
        ([{"role": "doctor", "content": SECRET}], "role must be one of"),
        ([{"role": "user", "content": 3}, {"role": "assistant", "content": SECRET}], "content must be"),
        ([{"role": "user", "content": SECRET}, "text"], "turn 2"),
    ],
)
def test_bad_shapes_rejected_without_quoting_content(conv: list, match: str, toks: dict) -> None:
    with pytest.raises(TemplateError, match=match) as err:
        encode_sft(toks["chatml"], get_template("chatml"), conv)
    assert SECRET not in str(err.value)


def test_render_prompt_requires_final_user_turn(toks: dict) -> None:
    with pytest.raises(TemplateError, match="end with a user"):
        render_prompt(get_template("chatml"), toks["chatml"], CONV[1:3])


def test_mismatch_names_template_tokenizer_and_token(toks: dict) -> None:
    llama2 = toks["vicuna"]
    with pytest.raises(TemplateTokenizerMismatch) as err:
        check_template(get_template("chatml"), llama2)
    msg = str(err.value)
    assert "'chatml'" in msg and type(llama2).__name__ in msg and "offline/llama2-like" in msg
    assert "<|im_start|>" in msg and "<|im_end|>" in msg
    with pytest.raises(TemplateTokenizerMismatch):
        encode_sft(llama2, get_template("chatml"), CONV)
    # llama3 needs <|begin_of_text|> as the BOS, not just somewhere in the vocabulary
    with pytest.raises(TemplateTokenizerMismatch, match="begin_of_text"):
        check_template(get_template("llama3"), llama2)


def test_mismatch_on_unk_and_missing_eos() -> None:
    vocab = {"<unk>": 0, "<|im_start|>": 1, "hello": 2}
    word = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>")
    with pytest.raises(TemplateTokenizerMismatch, match=r"'<\|im_end\|>' -> unk"):
        check_template(get_template("chatml"), tok)
    with pytest.raises(TemplateTokenizerMismatch, match="eos_token"):
        check_template(get_template("vicuna"), tok)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_encode_preference_round_trip(name: str, toks: dict) -> None:
    tok, tpl = toks[name], get_template(name)
    record = {"conversations": CONV[:4], "chosen": "建议复查血压。", "rejected": "不用管。"}
    out = encode_preference(tok, tpl, record)
    prompt = render_prompt(tpl, tok, record["conversations"])
    suffix = resolved_suffix(tpl, tok)
    assert _decode(tok, out["prompt_ids"]) == prompt
    chosen = response_text(tpl, tok, "建议复查血压。")
    assert _decode(tok, out["prompt_ids"] + out["chosen_ids"]) == prompt + chosen
    assert _decode(tok, out["prompt_ids"] + out["rejected_ids"]) == prompt + "不用管。" + suffix


def test_encode_preference_truncation_and_errors(toks: dict) -> None:
    tok, tpl = toks["chatml"], get_template("chatml")
    record = {"conversations": CONV[1:2], "chosen": "建议测量血压并做头颅CT检查。", "rejected": "不用管。"}
    full = encode_preference(tok, tpl, record)
    n = len(full["prompt_ids"])
    out = encode_preference(tok, tpl, record, max_len=n + 3)
    assert out["prompt_ids"] == full["prompt_ids"]
    assert out["chosen_ids"] == full["chosen_ids"][:3] and out["rejected_ids"] == full["rejected_ids"][:3]
    with pytest.raises(TemplateError, match="no room"):
        encode_preference(tok, tpl, record, max_len=n)
    with pytest.raises(TemplateError, match="end with a user"):
        encode_preference(tok, tpl, {**record, "conversations": CONV[:3]})
    with pytest.raises(TemplateError, match="'rejected'"):
        encode_preference(tok, tpl, {**record, "rejected": None})


def test_apply_to_tokenizer_survives_save(toks: dict, tmp_path) -> None:
    tok = offline_bpe(["<|im_start|>", "<|im_end|>"], eos_token="<|im_end|>")
    tpl: ChatTemplate = get_template("chatml")
    apply_to_tokenizer(tpl, tok)
    tok.save_pretrained(tmp_path)
    reloaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert reloaded.chat_template == tpl.jinja
    with pytest.raises(TemplateTokenizerMismatch):
        apply_to_tokenizer(tpl, toks["vicuna"])
