"""The stages on a model whose tokenizer ships its own chat template (Qwen3's, as TRL bundles it), with
`template: auto`: SFT encodes and trains through the template's training variant and saves the shipped template;
the preference, tool-calling and generation consumers render with it (plain process, no Ray)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from trl.chat_template_utils import qwen3_chat_template

from medgpt_ray import models, templates
from medgpt_ray.config import LoraConfig, StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.shards import read_records
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny model with Qwen3's shipped chat template in its tokenizer (its <|im_start|>/<|im_end|> are ChatML's)."""
    out = tmp_path_factory.mktemp("qwen3-template") / "model"
    shutil.copytree(tiny_model, out)
    tok = models.load_tokenizer(out)
    tok.chat_template = qwen3_chat_template
    tok.save_pretrained(out)
    return out


def test_sft_with_the_tokenizers_own_template(repo, qwen3_model, tmp_path):
    from medgpt_ray.stages.conversation_rows import encode_conversations

    d = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path / "data", 0.1, max_records=16)
    tok = models.load_tokenizer(qwen3_model)
    assert isinstance(templates.resolve(templates.AUTO, tok), templates.JinjaTemplate)
    ds, skipped = encode_conversations(read_records(d.train_file), tok, templates.AUTO, 8192)
    assert (skipped["too_long"], skipped["tools_unsupported"]) == (0, 0)
    row = ds[0]
    text = tok.decode(row["input_ids"])
    trained = tok.decode([t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100])
    assert EMPTY_THINK in text and "<think>" not in trained and trained.endswith("<|im_end|>")
    cfg = StageConfig(method="lora", lora=LoraConfig(rank=8, alpha=16, dropout=0.0), lr=5e-3, max_steps=3,
                      seq_len=128, effective_batch=4, logging_steps=1, save_steps=100)
    out = tmp_path / "sft"
    out.mkdir()
    r = run_stage(StageInputs("sft", cfg, plan_stage("sft", cfg, 1, False), str(qwen3_model), "auto",
                              d.train_file, d.eval_file, str(out)))
    assert r["steps"] == 3 and math.isfinite(r["train_loss_last"])
    # The trained model's tokenizer keeps the template users chat with (not the training variant).
    assert models.load_tokenizer(Path(r["output_model"])).chat_template == qwen3_chat_template


def test_tools_preferences_and_prompts_render_with_it(repo, qwen3_model, tmp_path):
    from medgpt_ray.generation.prompts import render_prompt, stop_token_ids
    from medgpt_ray.stages.conversation_rows import encode_conversations
    from medgpt_ray.stages.pair_rows import encode_pairs
    from medgpt_ray.stages.preference_rows import preference_texts

    tok, auto = models.load_tokenizer(qwen3_model), templates.AUTO
    sft = prepare_kind("sft", [str(repo / "data/sample/formats/sft_sharegpt_tools.jsonl")], tmp_path / "s", 0.1)
    records = [r for r in read_records(sft.train_file) + read_records(sft.eval_file) if r.get("tools")]
    ds, _ = encode_conversations(records, tok, auto, 8192)
    for row, record in zip(ds, records, strict=True):
        full = tok.decode(row["input_ids"])
        trained = tok.decode([t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100])
        assert "# Tools" in full and "# Tools" not in trained and "<tool_response>" not in trained
        for turn in record["conversations"]:
            if turn["role"] == "tool_call":
                calls = json.loads(turn["content"])
                for call in calls if isinstance(calls, list) else [calls]:
                    assert f'<tool_call>\n{{"name": "{call["name"]}"' in trained
    pref = prepare_kind("preference", [str(repo / "data/sample/formats/preference_sharegpt.jsonl")], tmp_path / "p",
                        0.1)
    pairs = read_records(pref.train_file) + read_records(pref.eval_file)
    texts, skipped = preference_texts(pairs, tok, auto)
    assert (skipped["tools_unsupported"], skipped["too_long"]) == (0, 0)
    assert all(p.endswith(EMPTY_THINK) for p in texts["prompt"])
    assert all(c.endswith("<|im_end|>") for c in texts["chosen"])
    encoded, rm_skipped = encode_pairs(pairs, tok, auto, 8192)
    assert len(encoded) == len(pairs) and rm_skipped["tools_unsupported"] == 0
    prompt = render_prompt(tok, auto, [{"role": "user", "content": "头痛怎么办？"}], None)
    assert prompt.endswith(EMPTY_THINK)
    assert tok.convert_tokens_to_ids("<|im_end|>") in stop_token_ids(tok, auto)
