"""SFT packing (medgpt_ray/trainer_kit/packed_rows.py, stages/packing.py) on the tiny model, in a plain process: a
packed batch computes what the padded batch of the same conversations computes, the model gets a block-diagonal mask
per row, and a packed stage trains, counts its real tokens and conversations, and equals the unpacked stage on a step
of the same conversations. (Resuming a packed stage: tests/stages/test_resume_batches.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medgpt_ray import models, templates
from medgpt_ray.config import ConfigError, LoraConfig, SFTStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.shards import num_rows, read_records
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.conversation_rows import encode_conversations
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.trainer_kit import packed_attention, packed_rows

SEQ_LEN = 512


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    """Short Alpaca QA (78-162 tokens with the tiny tokenizer) and ShareGPT consultations (206-486), mixed."""
    files = [str(repo / "data/sample/sft_alpaca.jsonl"), str(repo / "data/sample/sft_sharegpt.jsonl")]
    return prepare_kind("sft", files, tmp_path_factory.mktemp("data"), 0.1, max_records=40)


@pytest.fixture(scope="module")
def encoded(data, tiny_model):
    """Ten conversations of mixed lengths, encoded as the SFT stage encodes them."""
    tok = models.load_tokenizer(tiny_model)
    ds = encode_conversations(read_records(data.train_file)[:10], tok, templates.get_template("chatml"), SEQ_LEN)[0]
    lengths = [len(x) for x in ds["input_ids"]]
    assert min(lengths) < 150 < 190 < max(lengths), lengths  # short QA and long consultations both
    return tok, ds


def load(tiny_model: Path, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True, attn_implementation=attn)
    return model.eval()  # no dropout; gradients still flow


def loss_and_grads(model, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch, use_cache=False)  # as training calls it: transformers reads packed rows only cacheless
    out.loss.backward()
    return out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def padded_and_packed(tok, ds) -> tuple[dict, dict, list[dict]]:
    """The same conversations as one padded batch (TRL's collator, as an unpacked stage trains them) and as one
    batch of packed rows."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    padded = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
        [{"input_ids": i, "labels": la} for i, la in zip(ds["input_ids"], ds["labels"], strict=True)])
    rows = list(packed_rows.pack(ds, SEQ_LEN))
    return padded, packed_rows.collate_rows(rows, tok.pad_token_id, SEQ_LEN), rows


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_batch_has_the_loss_and_gradients_of_the_padded_batch(attn, encoded, tiny_model):
    """HF's loss is the mean over the batch's label tokens: one padded batch and one packed batch of the same ten
    conversations have the same label tokens, so the same loss and the same gradient of every parameter."""
    tok, ds = encoded
    padded, packed, rows = padded_and_packed(tok, ds)
    assert len(rows) < len(ds) and max(len(r["seq_lengths"]) for r in rows) >= 2  # really packed
    assert "attention_mask" not in packed and packed["input_ids"].shape == (len(rows), SEQ_LEN)
    model = load(tiny_model, attn)
    loss_padded, grads_padded = loss_and_grads(model, padded)
    loss_packed, grads_packed = loss_and_grads(model, packed)
    assert loss_packed == pytest.approx(loss_padded, abs=1e-4)
    assert grads_packed.keys() == grads_padded.keys() and len(grads_padded) == len(list(model.parameters()))
    for name, g in grads_padded.items():
        torch.testing.assert_close(grads_packed[name], g, atol=1e-4, rtol=1e-4, msg=name)


def test_the_model_gets_a_block_diagonal_mask_per_row_and_a_conversation_sees_only_itself(encoded, tiny_model):
    tok, ds = encoded
    _, packed, rows = padded_and_packed(tok, ds)
    model = load(tiny_model)
    assert packed_attention.attention_path(model)[0] == packed_attention.ROWS
    pos = packed["position_ids"]
    allowed = packed_attention.allowed_pairs(packed_attention.mask_the_model_builds(model, pos))
    assert torch.equal(allowed, packed_attention.block_diagonal(pos))
    r = next(i for i, row in enumerate(rows) if len(row["seq_lengths"]) >= 2)
    first, second = rows[r]["seq_lengths"][:2]
    assert allowed[r, first, first] and not allowed[r, first, first - 1]  # the 2nd conversation starts afresh
    real = sum(rows[r]["seq_lengths"])
    if real < SEQ_LEN:
        assert not allowed[r, real, real - 1]  # the tail padding does not join the last conversation
    # Equivalently: the first conversation's logits do not change when the second one's tokens do, and each
    # conversation's logits are its logits alone, unpadded (the second one's too: positions restart at 0).
    ids = packed["input_ids"][r : r + 1].clone()
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=pos[r : r + 1], use_cache=False).logits[0]
        alone = [model(input_ids=ids[:, :first]).logits[0], model(input_ids=ids[:, first : first + second]).logits[0]]
        ids[0, first : first + second] = torch.randint(1, tok.vocab_size, (second,))
        changed = model(input_ids=ids, position_ids=pos[r : r + 1], use_cache=False).logits[0, :first]
    torch.testing.assert_close(changed, logits[:first], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[0], logits[:first], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[1], logits[first : first + second], atol=1e-5, rtol=1e-5)


def test_flex_attention_packs_rows_with_a_checked_block_mask_and_each_conversation_sees_only_itself(encoded,
                                                                                                  tiny_model):
    """sft's `attention: flex` (the plan's attention, switched on the loaded model): packing checks the BlockMask
    transformers builds for packed position ids token by token, and each packed conversation's logits are its logits
    alone (forward only: flex attention has no CPU backward). A BlockMask that lets conversations see each other fails
    the same check."""
    from torch.nn.attention.flex_attention import create_block_mask

    tok, ds = encoded
    padded, packed, rows = padded_and_packed(tok, ds)
    model = load(tiny_model)
    packed_attention.use_attention(model, "flex")
    assert model.config._attn_implementation == packed_attention.FLEX
    mode, why = packed_attention.attention_path(model)
    assert mode == packed_attention.ROWS and "BlockMask" in why
    pos = packed["position_ids"]
    mask = packed_attention.mask_the_model_builds(model, pos)
    assert not isinstance(mask, torch.Tensor)  # a BlockMask, not a dense mask
    assert torch.equal(packed_attention.allowed_pairs(mask), packed_attention.block_diagonal(pos))
    causal = create_block_mask(lambda b, h, q, k: q >= k, pos.shape[0], 1, SEQ_LEN, SEQ_LEN, device="cpu")
    assert not torch.equal(packed_attention.allowed_pairs(causal), packed_attention.block_diagonal(pos))
    sdpa = load(tiny_model)
    with torch.no_grad():
        got = model(input_ids=packed["input_ids"], position_ids=pos, use_cache=False).logits
        for r, row in enumerate(rows):  # each packed conversation against itself alone, under SDPA
            start = 0
            for n in row["seq_lengths"]:
                alone = sdpa(input_ids=packed["input_ids"][r:r + 1, start:start + n]).logits[0]
                torch.testing.assert_close(got[r, start:start + n], alone, atol=1e-4, rtol=1e-4)
                start += n


def test_rows_filled_to_the_last_token_still_get_a_mask_and_the_same_loss(encoded, tiny_model):
    """A micro-batch whose rows each hold one conversation cut to seq_len has no restart in its position ids:
    transformers would give it no mask (another graph for compiled layers). Its last position restarts instead,
    which changes neither the loss nor a gradient."""
    tok, ds = encoded
    width = min(len(x) for x in ds["input_ids"]) // 2  # every conversation cut to fill a row exactly
    rows = [{"input_ids": list(i[:width]), "labels": list(la[:width]), "seq_lengths": [width]}
            for i, la in zip(ds["input_ids"][:3], ds["labels"][:3], strict=True)]
    batch = packed_rows.collate_rows(rows, tok.pad_token_id, width)
    assert batch["position_ids"][:, -1].tolist() == [0, 0, 0]
    assert batch["labels"][:, -1].tolist() == [r["labels"][-1] for r in rows]  # the last target is kept
    model = load(tiny_model)
    assert packed_attention.mask_the_model_builds(model, batch["position_ids"]) is not None
    plain = {"input_ids": batch["input_ids"], "labels": batch["labels"],
             "position_ids": torch.arange(width).expand(3, width)}
    assert packed_attention.mask_the_model_builds(model, plain["position_ids"]) is None  # what the restart prevents
    loss_rows, grads_rows = loss_and_grads(model, batch)
    loss_plain, grads_plain = loss_and_grads(model, plain)
    assert loss_rows == pytest.approx(loss_plain, abs=1e-5)
    for name, g in grads_plain.items():
        torch.testing.assert_close(grads_rows[name], g, atol=1e-5, rtol=1e-5, msg=name)


def test_packing_true_where_the_mask_would_cross_conversations_is_a_config_error(tiny_model, monkeypatch):
    """A transformers that did not read packed position ids (plain causal mask) is caught by the probe: auto
    trains unpacked and says why, true is an error naming the key."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    model = load(tiny_model)
    mode, why = packed_attention.resolve("auto", model, "sft")
    assert mode is None and "block-diagonal" in why
    with pytest.raises(ConfigError, match=r"stages\.sft\.packing: true, but .*set it to auto"):
        packed_attention.resolve(True, model, "sft")
    assert packed_attention.resolve(False, model, "sft") == (None, "packing: false")


def stage_inputs(data, tiny_model: Path, out: Path, **kw) -> StageInputs:
    cfg = SFTStageConfig(**{"method": "lora", "lora": LoraConfig(rank=8, alpha=16, dropout=0.0), "lr": 5e-3,
                            "seq_len": SEQ_LEN, "logging_steps": 1, "save_steps": 100, "warmup_ratio": 0.0, **kw})
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs("sft", cfg, plan_stage("sft", cfg, 1, False), str(tiny_model), "chatml", data.train_file,
                       data.eval_file, str(out))


class _Spy:
    """What the model is called with in training, and the real-token count of every collated batch, in order."""

    def __init__(self, trainer):
        self.calls: list[dict] = []
        self.tokens: list[int] = []
        collate = trainer.train_collate

        def counting(examples):
            batch = collate(examples)
            self.tokens.append(int(batch[packed_rows.TOKENS_KEY]))
            return batch

        trainer.train_collate = counting
        trainer.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if module.training:
            self.calls.append({k: v.shape if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})


def test_a_packed_stage_trains_on_rows_and_counts_real_tokens_and_conversations(data, tiny_model, tmp_path):
    built = build_stage(stage_inputs(data, tiny_model, tmp_path, max_steps=6, effective_batch=8, packing=True))
    report = built.extras["packing"]
    assert report["mode"] == packed_attention.ROWS
    assert report["conversations_per_row"] > 1.4 and 0.5 < report["fill"] <= 1
    trainer = built.trainer
    assert trainer.args.include_num_input_tokens_seen == "no"  # ours counts (PackedCounts)
    assert trainer.args.per_device_train_batch_size == report["micro_batch_rows"]
    assert trainer.args.gradient_accumulation_steps == report["grad_accum"]
    assert report["micro_batch_rows"] * report["grad_accum"] == report["rows_per_step"] == round(
        8 / report["sampled_conversations_per_row"])
    spy = _Spy(trainer)
    trainer.train()
    micro_batches = 6 * report["grad_accum"]
    assert len(spy.calls) == micro_batches
    for call in spy.calls:  # one packed row per batch row, and the model builds the mask from the position ids
        assert "attention_mask" not in call and packed_rows.TOKENS_KEY not in call
        assert call["input_ids"] == call["position_ids"] and call["input_ids"][1] == SEQ_LEN
        assert call["input_ids"][0] <= report["micro_batch_rows"]  # the epoch's last micro-batch may be short
    # Non-padding tokens only: the batches the steps took (the loader may have collated one more ahead).
    assert trainer.state.num_input_tokens_seen == sum(spy.tokens[:micro_batches])
    assert trainer.state.num_input_tokens_seen < micro_batches * report["micro_batch_rows"] * SEQ_LEN
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 6 and logs[-1]["loss"] < logs[0]["loss"]
    per_step = [h["conversations_per_step"] for h in logs]
    assert all(x >= report["rows_per_step"] for x in per_step)  # at least one conversation a row
    assert abs(sum(per_step) / 6 - 8) <= report["sampled_conversations_per_row"]  # about effective_batch
    assert logs[-1]["num_tokens"] == trainer.state.num_input_tokens_seen  # TRL's metric, from the real tokens too


def test_one_step_of_the_same_conversations_packed_or_not_has_the_same_loss_and_gradient(data, tiny_model, tmp_path):
    """Through the whole stage (TRL's chunked LM head, sync-free loss, the HF Trainer's normalisation over the
    step's label tokens): a step that takes every conversation of the split, packed or padded."""
    n = num_rows(data.train_file)
    first = {}
    for pack in (False, True):
        built = build_stage(stage_inputs(data, tiny_model, tmp_path / str(pack), max_steps=1, effective_batch=n,
                                         packing=pack))
        built.trainer.train()
        first[pack] = next(h for h in built.trainer.state.log_history if "loss" in h)
        assert built.trainer.state.num_input_tokens_seen == first[False]["num_tokens"]  # every real token, once
    assert first[True]["conversations_per_step"] == n
    assert first[True]["loss"] == pytest.approx(first[False]["loss"], rel=1e-5)
    assert first[True]["grad_norm"] == pytest.approx(first[False]["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("planned_lengths", [False, True], ids=["planned-blind", "planned-packed"])
def test_packing_by_length_trains_padded_bins_where_the_model_could_pack(planned_lengths, data, tiny_model, tmp_path,
                                                                         capsys):
    """`packing: by_length` never packs, on a model that could: each conversation its own row, micro-batches of
    conversations of similar length under a packed row's tokens (trainer_kit/length_bins.py), the plan it trains
    sent to the driver for plan.json, and it learns. Planned with the split's lengths (a packed plan, as the
    pipeline plans) or without (the worker sizes the rows from a sample first)."""
    from dataclasses import replace

    from medgpt_ray.memory.lengths import BUCKET
    from medgpt_ray.memory.stage_plan import packed_rows
    from medgpt_ray.trainer_kit.length_bins import LengthBinSampler

    inp = stage_inputs(data, tiny_model, tmp_path, max_steps=6, effective_batch=8, packing="by_length")
    if planned_lengths:
        inp = replace(inp, plan=packed_rows(inp.plan, inp.cfg, 4, 2.0))
    records: list[dict] = []
    built = build_stage(inp, records.append)
    report = built.extras["packing"]
    assert report["mode"] is None and report["why"] == "packing: by_length (never packed)"
    assert "padded by length instead" in report["planned_packed"]
    assert "[sft] packing: by_length -> padded by length, micro-batches of" in capsys.readouterr().out
    sent = [r["worker_plan"] for r in records if "worker_plan" in r]
    assert len(sent) == 1 and sent[0]["packing"] is None and sent[0]["length_bins"]["bin_tokens"] == SEQ_LEN
    assert "packing: by_length; padded by length" in sent[0]["reasons"][-1]
    loader = built.trainer.get_train_dataloader()
    sampler = loader.base_dataloader.batch_sampler if hasattr(loader, "base_dataloader") else loader.batch_sampler
    assert isinstance(sampler, LengthBinSampler)
    for examples, batch in zip(sampler, loader, strict=True):
        rows, width = batch["input_ids"].shape
        assert rows == len(examples) and "position_ids" not in batch  # a row per conversation, none packed
        assert rows * (-(-width // BUCKET) * BUCKET) <= sent[0]["micro_batch"] * SEQ_LEN
    assert max(len(b) for b in sampler) > sent[0]["micro_batch"]  # short ones: many rows in a micro-batch
    built.trainer.train()
    logs = [h for h in built.trainer.state.log_history if "loss" in h]
    assert len(logs) == 6 and logs[-1]["loss"] < logs[0]["loss"]


def test_a_packed_stage_writes_its_rows_into_the_result_and_metrics(data, tiny_model, tmp_path):
    from medgpt_ray.stages import run_stage

    r = run_stage(stage_inputs(data, tiny_model, tmp_path, max_steps=2, effective_batch=4))  # packing: auto
    assert r["packing"]["mode"] == packed_attention.ROWS and r["packing"]["rows"] < r["train_records"]
    assert r["workers"][0]["shard"]["packed"]["rows"] == r["packing"]["rows"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in rows if "loss" in x]
    assert len(steps) == 2 and all(x["conversations_per_step"] > 0 and x["tokens_per_s"] > 0 for x in steps)
