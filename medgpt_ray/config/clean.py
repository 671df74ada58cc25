"""The cleaner's options (`data.clean`, or `medgpt-ray clean --config`): normalize, PII, sign-offs, quality, dedup."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from medgpt_ray.config.base import _Strict


class NormalizeConfig(_Strict):
    enabled: bool = True
    fullwidth_to_halfwidth: bool = True  # ASCII letters/digits/space only; Chinese punctuation stays
    collapse_whitespace: bool = True
    traditional_to_simplified: bool = False  # OpenCC t2s


class PIIConfig(_Strict):
    enabled: bool = True
    types: list[Literal["id_card", "phone", "email", "bank_card"]] = ["id_card", "phone", "email", "bank_card"]


class SignoffConfig(_Strict):
    enabled: bool = True
    # Stock closing phrases stripped from the end of responses (regular expressions, Python `re`).
    phrases: list[str] = [
        r"感谢您?的?(咨询|信任|提问|使用)[^。！!]*[。！!]?",
        r"祝您?(身体)?(健康|早日康复|生活愉快)[^。！!]*[。！!]?",
        r"如有(其他|任何)?(疑问|问题)[^。！!]*[。！!]?",
        r"希望(我的回答|以上回答|以上内容)?(对您)?有(所)?帮助[^。！!]*[。！!]?",
        r"(以上(建议|内容|回答))?仅供参考[^。！!]*[。！!]?",
    ]

    @field_validator("phrases")
    @classmethod
    def _compiles(cls, phrases: list[str]) -> list[str]:
        # Checked here, when the config loads, not first inside a Ray task on the first response it meets.
        for i, phrase in enumerate(phrases, 1):
            try:
                re.compile(phrase)
            except re.error as e:
                raise ValueError(f"phrase {i} ({phrase!r}) is not a valid regular expression: {e}") from None
        return phrases


class QualityConfig(_Strict):
    enabled: bool = True
    min_chars: Annotated[int, Field(ge=0)] = 2  # per field (text, system/user turns, rejected) except responses
    max_chars: Annotated[int, Field(ge=1)] = 20000  # every field (tool_call/tool turns and a prompt's answer too)
    # Responses (assistant turns, chosen): 1, because a one-term answer (肝, CT, 0.5g) is a full answer in medical
    # QA; short filler is caught by content (data/ops/quality.py), not by length.
    min_response_chars: Annotated[int, Field(ge=0)] = 1
    # Low-information answers: Shannon entropy (bits) of the jieba tokens of a response (field report: 1.5),
    # used for filler (below: low_entropy, else non_answer) and for responses of at least min_entropy_tokens
    # content tokens; shorter responses are not judged by entropy (a 1-2 token answer scores 0-1 bit whatever
    # it says: 阿奇霉素, 肿瘤科；肿瘤外科).
    min_response_entropy_bits: Annotated[float, Field(ge=0)] = 1.5
    min_entropy_tokens: Annotated[int, Field(ge=1)] = 8  # jieba content tokens before entropy judges a response
    max_char_repetition: Annotated[float, Field(gt=0, le=1)] = 0.5  # share of the most frequent char 3-gram
    # Special characters: not CJK, not letters/digits, not common punctuation or unit symbols (mg, ℃, %, /, ±…),
    # so dosage- and lab-heavy clinical text is kept.
    max_special_char_ratio: Annotated[float, Field(ge=0, le=1)] = 0.3


class DedupConfig(_Strict):
    exact: bool = True
    near: bool = True
    ngram: Annotated[int, Field(ge=1)] = 5  # character n-grams
    num_perm: Annotated[int, Field(ge=8)] = 128
    bands: Annotated[int, Field(ge=1)] = 16  # rows per band = num_perm / bands
    threshold: Annotated[float, Field(gt=0, le=1)] = 0.8  # reported Jaccard estimate for a near duplicate
    seed: int = 1


class CleanConfig(_Strict):
    normalize: NormalizeConfig = NormalizeConfig()
    pii: PIIConfig = PIIConfig()
    signoff: SignoffConfig = SignoffConfig()
    quality: QualityConfig = QualityConfig()
    dedup: DedupConfig = DedupConfig()
    # Ray Data: rows per block and per map batch, and CPUs per cleaning task. One task per core: the cleaner uses
    # tasks, not actor pools, and 0.5 (two per core) measured 12 % slower on one core with twice the memory
    # (bench/README.md).
    batch_size: Annotated[int, Field(ge=1)] = 1024
    num_cpus_per_task: Annotated[float, Field(gt=0)] = 1.0
    # Input chunks (one task and one intermediate file each) per CPU of the cluster: more evens out the load at
    # the end, fewer saves per-task cost; chunks stay between 256 KiB and 4 MiB (data.chunks) whatever this says.
    chunks_per_cpu: Annotated[int, Field(ge=1)] = 4
