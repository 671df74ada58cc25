"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from tests.unit.template_tokenizers import family_tokenizers


@pytest.fixture(scope="session")
def toks() -> dict[str, PreTrainedTokenizerFast]:
    """One offline tokenizer per template family (chatml/qwen, llama3, vicuna/alpaca)."""
    return family_tokenizers()
