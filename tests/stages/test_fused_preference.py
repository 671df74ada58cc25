"""ORPO and SimPO on TRL's chunked LM head (trainer_kit/fused_preference.py, issue 49 item 4) against TRL's own
ORPOTrainer and CPOTrainer on the full logits: the same batch, the same LoRA model, loss and every adapter gradient
within 1e-4; for CPO also with cpo_alpha 0 (no NLL term) and the sigmoid loss (summed log-probabilities)."""

from __future__ import annotations

import os

import pytest
import torch

from medgpt_ray import models
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.fused_preference import FusedCPO, FusedORPO, add_fused_head

PAIRS = {
    "prompt": ["<|im_start|>user\n头痛三天怎么办？<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n发烧38.5度需要吃药吗？<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n高血压患者饮食注意什么？<|im_end|>\n<|im_start|>assistant\n"],
    "chosen": ["建议休息，多喝水，若持续不缓解请到神经内科就诊。<|im_end|>\n",
               "可以物理降温，必要时服用对乙酰氨基酚。<|im_end|>\n",
               "低盐低脂饮食，规律服药。<|im_end|>\n"],
    "rejected": ["不用管。<|im_end|>\n", "马上输液。<|im_end|>\n",
                 "随便吃，血压高一点没关系，平时也不用测量血压，更不用去医院复查。<|im_end|>\n"],
}


@pytest.fixture(scope="module")
def lora_model(tiny_model):
    """The tiny model with TRL's fused head added, then LoRA (adapters made non-zero so they matter)."""
    from peft import get_peft_model

    from medgpt_ray.config import LoraConfig

    torch.manual_seed(0)
    base = models.load_causal_lm(tiny_model, "fp32", "lora")
    add_fused_head(base)
    model = get_peft_model(base, models.lora_config(LoraConfig(rank=4, alpha=8, dropout=0.0), "CAUSAL_LM", base))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model


def _trainers(kind: str, model, tok, tmp_path, **config):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset

    if kind == "orpo":
        from trl.experimental.orpo import ORPOConfig as Config
        from trl.experimental.orpo import ORPOTrainer as Trainer
        fused = FusedORPO
    else:
        from trl.experimental.cpo import CPOConfig as Config
        from trl.experimental.cpo import CPOTrainer as Trainer
        fused = FusedCPO
    args = Config(output_dir=str(tmp_path / kind), per_device_train_batch_size=3, max_length=96, report_to="none",
                  use_cpu=True, remove_unused_columns=False, dataset_num_proc=None, **config)
    ds = Dataset.from_dict(PAIRS)
    return [cls(model=model, args=args, train_dataset=ds, processing_class=tok)
            for cls in (Trainer, trainer_class(Trainer, fused))]


def _loss_and_grads(trainer, model, batch) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss, _ = trainer.get_batch_loss_metrics(model, batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("kind", "config"), [
    ("orpo", {"beta": 0.1}),
    ("simpo", {"loss_type": "simpo", "cpo_alpha": 0.5, "simpo_gamma": 0.5, "beta": 2.0}),
    ("simpo", {"loss_type": "simpo", "cpo_alpha": 0.0, "beta": 2.0}),
    ("cpo", {"loss_type": "sigmoid", "cpo_alpha": 1.0, "beta": 0.1}),
])
def test_the_fused_loss_and_gradients_are_the_trainers_own(kind, config, lora_model, tiny_model, tmp_path):
    tok = models.load_tokenizer(tiny_model)
    plain, fused = _trainers("orpo" if kind == "orpo" else "cpo", lora_model, tok, tmp_path, **config)
    batch = plain._prepare_inputs(next(iter(plain.get_train_dataloader())))
    assert (batch["chosen_labels"] != -100).sum() > 0 and batch["chosen_input_ids"].shape[0] == 3
    want, want_grads = _loss_and_grads(plain, lora_model, batch)
    got, got_grads = _loss_and_grads(fused, lora_model, batch)
    assert got == pytest.approx(want, abs=1e-4) and abs(want) > 1e-3
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 4 and all("lora_" in n for n in got_grads)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize(("kind", "config"), [
    ("orpo", {"beta": 0.1}),
    ("simpo", {"loss_type": "simpo", "cpo_alpha": 0.5, "simpo_gamma": 0.5, "beta": 2.0}),
])
def test_a_bucketed_pass_pads_to_the_multiple_and_changes_no_loss_or_gradient(kind, config, lora_model, tiny_model,
                                                                               tmp_path):
    """Where the layers are compiled the stage sets pad_to_multiple_of (trainer_args.bucket_kwargs): the model sees
    the concatenated rows padded to that multiple, and the loss and gradients are the trainer's own."""
    tok = models.load_tokenizer(tiny_model)
    plain, fused = _trainers("orpo" if kind == "orpo" else "cpo", lora_model, tok, tmp_path, **config)
    fused.pad_to_multiple_of = 64
    batch = plain._prepare_inputs(next(iter(plain.get_train_dataloader())))
    width = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
    assert width % 64, width  # the collator's own width is not a multiple already
    seen: list[int] = []
    hook = lora_model.get_base_model().model.register_forward_pre_hook(
        lambda m, a, kw: seen.append((a[0] if a else kw["input_ids"]).shape[1]), with_kwargs=True)
    try:
        want, want_grads = _loss_and_grads(plain, lora_model, batch)
        got, got_grads = _loss_and_grads(fused, lora_model, batch)
    finally:
        hook.remove()
    assert seen == [width, -(-width // 64) * 64]
    assert got == pytest.approx(want, abs=1e-4)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-4, rtol=1e-3, msg=name)
