"""The reward model's score head and pairwise loss in fp32 under bf16 (stages/score_head.py; issue 36 item 8), on
the tiny model in a plain process with the real TRL: pairs whose scores are a few hundred and half a point apart
(256.5 against 256.0 rounds to a zero margin in bf16). The rm stage's trainer, built in bf16 (bf16 weights, bf16
autocast), takes their loss within 1e-3 of the exact one, where the same head computed in bf16 misses it by more;
the online-RL scorers (the merged rm's RewardModelScore, the shared base's head) keep the half point too."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from medgpt_ray.config import StageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.kinds.rm.stage import build
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.score_head import Fp32Linear, fp32_linears, score_head

EASY_PAIRS = "tests/data/easy_reward_pairs.jsonl"
# Chosen and rejected scores of the test's pairs: every margin rounds to 0 (or to 2) in bf16.
CHOSEN = [256.5, 300.25, 260.5, 129.25]
REJECTED = [256.0, 300.0, 260.0, 129.0]


def exact_loss() -> float:
    return sum(-math.log(1 / (1 + math.exp(-(c - r)))) for c, r in zip(CHOSEN, REJECTED, strict=True)) / len(CHOSEN)


@pytest.fixture(scope="module")
def bf16_trainer(repo, tiny_model, tmp_path_factory):
    """The rm stage's trainer as a bf16 run builds it (kinds/rm/stage.py build), full fine-tuning, and a batch of
    four pairs from its collator."""
    data = prepare_kind("preference", [str(repo / EASY_PAIRS)], tmp_path_factory.mktemp("data"), 0.25,
                        max_records=12)
    cfg = StageConfig(method="full", lr=1e-5, max_steps=1, seq_len=96, effective_batch=4, save_steps=100)
    plan = replace(plan_stage("rm", cfg, 1, False), precision="bf16")
    inp = StageInputs("rm", cfg, plan, str(tiny_model), "chatml", data.train_file, data.eval_file,
                      str(tmp_path_factory.mktemp("rm")))
    trainer = build(inp).trainer
    rows = [trainer.train_dataset[i] for i in range(len(CHOSEN))]
    return trainer, trainer.data_collator(rows)


def scored_hidden(trainer, batch) -> torch.Tensor:
    """The final hidden states the head scores (each sequence's last non-pad token, as transformers picks it), from
    the bf16 decoder: [chosen..., rejected...] x hidden."""
    seen = {}
    hook = score_head(trainer.model).register_forward_hook(lambda m, args, out: seen.setdefault("h", args[0]))
    try:
        with torch.no_grad(), trainer.compute_loss_context_manager():
            trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    finally:
        hook.remove()
    ids = batch["input_ids"]
    last = (torch.arange(ids.shape[1]) * (ids != trainer.processing_class.pad_token_id)).argmax(-1)
    return seen["h"][torch.arange(len(ids)), last]


def test_bf16_training_takes_the_pairwise_loss_in_fp32(bf16_trainer):
    trainer, batch = bf16_trainer
    head = score_head(trainer.model)
    assert isinstance(head, Fp32Linear) and head.weight.dtype == torch.float32
    assert next(trainer.model.model.parameters()).dtype == torch.bfloat16 and trainer.args.bf16  # a bf16 run
    hidden = scored_hidden(trainer, batch)
    assert hidden.dtype == torch.bfloat16
    # A head scoring the pairs CHOSEN and REJECTED exactly (least squares on the bf16 hidden states, in fp64).
    targets = torch.tensor(CHOSEN + REJECTED, dtype=torch.float64)
    w = torch.linalg.lstsq(hidden.double(), targets[:, None]).solution.T
    assert torch.allclose(hidden.double() @ w.T, targets[:, None], atol=1e-6)
    with torch.no_grad():
        head.weight.copy_(w)
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(exact_loss(), abs=1e-3)
    # The same head in bf16 (what a bf16 run computed before): every margin rounds away, the loss misses by more.
    scores = torch.nn.functional.linear(hidden, w.to(torch.bfloat16)).reshape(-1)
    n = len(CHOSEN)
    bf16_loss = -torch.nn.functional.logsigmoid(scores[:n] - scores[n:]).float().mean().item()
    assert abs(bf16_loss - exact_loss()) > 1e-3


def test_fp32_linears_score_in_fp32_under_bf16_autocast():
    """A bf16 head made Fp32Linear: fp32 weights and output inside bf16 autocast; its state dict keys unchanged."""
    head = torch.nn.Linear(4, 1, bias=False).to(torch.bfloat16)
    keys = set(head.state_dict())
    head = fp32_linears(head)
    x = torch.tensor([[256.5, 0.0, 0.0, 0.0], [256.0, 0.0, 0.0, 0.0]])
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x)
    assert out.dtype == torch.float32 and (out[0] - out[1]).item() == 0.5 and set(head.state_dict()) == keys
    with pytest.raises(TypeError, match="cannot be computed in fp32"):
        fp32_linears(torch.nn.ReLU())


def test_the_online_rl_reward_model_scores_in_fp32_on_a_bf16_network(tiny_model, tmp_path):
    """RewardModelScore (the grpo/rloo reward_model reward, and the reward actor's) on a bf16 network, scores made a
    few hundred: they keep their fractions, where scores from a bf16 head are whole or even numbers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from medgpt_ray.stages.rewards import RewardModelScore

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=1, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)
    rm.config.pad_token_id = tok.pad_token_id
    with torch.no_grad():
        rm.score.weight.mul_(300 / rm.score.weight.norm())  # scores of a few hundred
    rm.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = RewardModelScore(str(tmp_path))
    scorer._load()
    scorer._model.to(torch.bfloat16)  # the network as a GPU worker loads it
    assert isinstance(scorer._model.score, Fp32Linear)
    scores = scorer(prompts=["患者胸痛，去哪个科室？"] * 4, completions=["心内科", "呼吸科", "骨科", "a"])
    assert max(abs(s) for s in scores) > 64
    assert any(torch.tensor(s).to(torch.bfloat16).item() != s for s in scores)  # not bf16 numbers
