"""Packed reward-model training (medgpt_ray/stages/reward_packing.py) on the tiny model, in a plain process, with the
real TRL: a batch of packed pair rows has the loss, the metrics and the gradient of every trainable parameter of
TRL's padded batch of the same pairs (full fine-tuning and LoRA), and an rm stage trains packed through the stage
runner, with its held-out accuracy, and equals the unpacked stage on a step of the same pairs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from medgpt_ray import models, templates
from medgpt_ray.config import LoraConfig, RMStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.shards import num_rows, read_records
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage, reward_packing, run_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.pair_rows import encode_pairs
from medgpt_ray.stages.reward_trainer import PackedRewardTrainer
from medgpt_ray.trainer_kit import packed_attention, packed_rows
from tests.stages.test_stages import EASY_PAIRS

SEQ_LEN = 256  # rows of 512 tokens: the easy pairs (170-240 tokens both sides) pack two a row
LORA = LoraConfig(rank=8, alpha=16, dropout=0.0)


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    return prepare_kind("preference", [str(repo / EASY_PAIRS)], tmp_path_factory.mktemp("data"), 0.25,
                        max_records=24)


@pytest.fixture(scope="module")
def pairs(data, tiny_model):
    tok = models.load_tokenizer(tiny_model)
    return tok, encode_pairs(read_records(data.train_file)[:10], tok, templates.get_template("chatml"), SEQ_LEN)[0]


def trainer_for(method: str, tiny_model: Path, tok, rows, out: Path) -> PackedRewardTrainer:
    from trl import RewardConfig

    model = models.load_reward_model(tiny_model, "fp32", method, tok.pad_token_id)
    args = RewardConfig(output_dir=str(out), report_to="none", use_cpu=True, bf16=False, max_length=None,
                        center_rewards_coefficient=0.01)
    return PackedRewardTrainer(
        model=model, args=args, train_dataset=rows, processing_class=tok,
        peft_config=models.lora_config(LORA, "SEQ_CLS", model) if method == "lora" else None)


def loss_grads_metrics(trainer, batch: dict) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    trainer.model.zero_grad()
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
    return loss.item(), grads, metrics


@pytest.mark.parametrize(("method", "mode"), [("full", packed_attention.ROWS), ("lora", packed_attention.ROWS),
                                              ("full", packed_attention.FLAT)])
def test_packed_pairs_have_the_loss_metrics_and_gradients_of_trls_padded_batch(method, mode, pairs, tiny_model,
                                                                               tmp_path):
    """TRL's RewardTrainer.compute_loss on its collator's padded batch of ten pairs, and ours on the same pairs
    packed into rows (ROWS; FLAT, the FlashAttention layout, is one flattened row, which SDPA masks the same way):
    the same Bradley-Terry loss (with center_rewards_coefficient), accuracy, margin, rewards and gradients."""
    tok, ds = pairs
    rows = reward_packing.pack_pairs(ds, SEQ_LEN)
    assert len(rows) < len(ds) and max(len(r["seq_lengths"]) for r in rows) >= 2  # really packed
    trainer = trainer_for(method, tiny_model, tok, rows, tmp_path)
    padded = trainer.data_collator([{"chosen_ids": c, "rejected_ids": r}
                                    for c, r in zip(ds["chosen_ids"], ds["rejected_ids"], strict=True)])
    packed = reward_packing.PairRowsCollator(mode, tok.pad_token_id, SEQ_LEN)(list(rows))
    assert "attention_mask" not in packed and int(packed[packed_rows.CONVERSATIONS_KEY]) == len(ds)
    if mode == packed_attention.ROWS:
        assert packed["input_ids"].shape == (len(rows), 2 * SEQ_LEN)
    loss_padded, grads_padded, metrics_padded = loss_grads_metrics(trainer, padded)
    loss_packed, grads_packed, metrics_packed = loss_grads_metrics(trainer, packed)
    assert loss_packed == pytest.approx(loss_padded, abs=1e-4)
    assert metrics_packed == pytest.approx(metrics_padded, abs=1e-4)
    assert any("score" in n for n in grads_padded)  # the head trains (LoRA: its modules_to_save copy)
    if method == "lora":
        assert any("lora_" in n for n in grads_padded) and len(grads_padded) < len(list(trainer.model.parameters()))
    assert grads_packed.keys() == grads_padded.keys()
    for name, g in grads_padded.items():
        torch.testing.assert_close(grads_packed[name], g, atol=1e-4, rtol=1e-4, msg=name)


def test_auto_leaves_rm_padded(data, tiny_model, tmp_path):
    """Packed rm rows measured no faster than padded pairs (on the H200; slower on CPU): auto does not pack rm."""
    from medgpt_ray.kinds.rm.memory import AUTO_UNPACKED

    built = build_stage(stage_inputs(data, tiny_model, tmp_path, max_steps=1, effective_batch=4))
    assert built.extras["packing"] == {"mode": None, "why": AUTO_UNPACKED}


def test_center_rewards_coefficient_reaches_the_trainer_and_its_loss(data, tiny_model, tmp_path):
    """stages.rm.center_rewards_coefficient (configs/tiny-cpu-rl.yaml: rloo's reward model) is TRL's: the loss gains
    coefficient x mean((chosen + rejected)^2); off (null) by default."""
    plain = build_stage(stage_inputs(data, tiny_model, tmp_path / "plain", max_steps=1, effective_batch=4))
    centred = build_stage(stage_inputs(data, tiny_model, tmp_path / "centred", max_steps=1, effective_batch=4,
                                       center_rewards_coefficient=0.5))
    assert plain.trainer.args.center_rewards_coefficient is None
    assert centred.trainer.args.center_rewards_coefficient == 0.5
    batch = plain.trainer.data_collator([plain.trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():
        rewards = plain.trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
        base = plain.trainer.compute_loss(plain.trainer.model, dict(batch)).item()
        centred.trainer.model.load_state_dict(plain.trainer.model.state_dict())
        loss = centred.trainer.compute_loss(centred.trainer.model, dict(batch)).item()
    chosen, rejected = rewards.chunk(2)  # TRL's collator: the chosen sequences, then the rejected
    assert loss == pytest.approx(base + 0.5 * ((chosen + rejected) ** 2).mean().item(), rel=1e-4, abs=1e-5)


def test_a_sequence_is_scored_at_its_last_non_pad_token_as_the_padded_model_scores_it():
    ids, positions = [5, 6, 7, 0, 8, 9, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3]  # pad 0; the 2nd sequence ends in pads
    assert reward_packing.scored_tokens(ids, positions, pad_id=0) == [2, 5]
    assert reward_packing.scored_tokens([0, 0, 4], [0, 1, 0], pad_id=0) == [0, 2]  # all pad: its first token


def stage_inputs(data, tiny_model: Path, out: Path, **kw) -> StageInputs:
    cfg = RMStageConfig(**{"method": "lora", "lora": LORA, "lr": 5e-3, "seq_len": SEQ_LEN, "logging_steps": 1,
                           "save_steps": 100, "warmup_ratio": 0.0, **kw})
    out.mkdir(parents=True, exist_ok=True)
    return StageInputs("rm", cfg, plan_stage("rm", cfg, 1, False), str(tiny_model), "chatml", data.train_file,
                       data.eval_file, str(out))


def test_a_packed_rm_stage_trains_counts_pairs_and_reports_held_out_accuracy(data, tiny_model, tmp_path):
    r = run_stage(stage_inputs(data, tiny_model, tmp_path, max_steps=2, effective_batch=4, packing=True))
    p = r["packing"]
    assert p["mode"] == packed_attention.ROWS and p["rows"] < p["pairs"] == r["train_pairs"] and 0.5 < p["fill"] <= 1
    assert 0.0 <= r["eval"]["eval_accuracy"] <= 1.0 and r["eval"]["eval_pairs"] > 0  # evaluated unpacked
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in steps if "loss" in x]
    assert len(steps) == 2 and all(math.isfinite(x["loss"]) and x["pairs_per_step"] >= 1 for x in steps)
    assert all(x["tokens_per_s"] > 0 and 0 <= x["accuracy"] <= 1 for x in steps)


def test_one_step_of_the_same_pairs_packed_or_not_has_the_same_loss_and_gradient(data, tiny_model, tmp_path):
    """Through the whole stage (sharded loader, TRL's trainer, PackedCounts' counts): one step of every pair of
    the split in one micro-batch, packed rows or TRL's padded batch."""
    n = num_rows(data.train_file)
    first = {}
    for pack in (False, True):
        built = build_stage(stage_inputs(data, tiny_model, tmp_path / str(pack), max_steps=1, effective_batch=n,
                                         micro_batch=n, packing=pack, group_by_length=False))
        built.trainer.train()
        first[pack] = next(h for h in built.trainer.state.log_history if "loss" in h)
    assert first[True]["pairs_per_step"] == n
    assert first[True]["num_tokens"] == first[False]["num_tokens"]  # the real tokens, packed or padded
    assert first[True]["loss"] == pytest.approx(first[False]["loss"], rel=1e-5)
    assert first[True]["grad_norm"] == pytest.approx(first[False]["grad_norm"], rel=1e-4)
    assert first[True]["accuracy"] == pytest.approx(first[False]["accuracy"])
