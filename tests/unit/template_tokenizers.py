"""Offline tokenizers for the template tests: a byte-level BPE with Qwen2's pre-tokenizer pipeline trained on a
few Chinese/English strings, with each model family's control tokens added as special tokens."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
CORPUS = [
    "患者男性，45岁，头痛三天，伴有恶心。建议测量血压并做头颅CT检查。",
    "高血压患者应低盐饮食，规律服药，定期复查。",
    "What are the symptoms of diabetes? Thirst, frequent urination and fatigue.",
    "USER: ASSISTANT: ### Instruction: ### Response: system user assistant",
]


def offline_bpe(specials: list[str], **named: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **named)


def family_tokenizers() -> dict[str, PreTrainedTokenizerFast]:
    qwen = offline_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos_token="<|endoftext|>")
    llama3 = offline_bpe(
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )
    llama2 = offline_bpe(["<s>", "</s>"], bos_token="<s>", eos_token="</s>", name_or_path="offline/llama2-like")
    return {"chatml": qwen, "qwen": qwen, "llama3": llama3, "vicuna": llama2, "alpaca": llama2}
