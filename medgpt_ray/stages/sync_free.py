"""TRL's SFT training loss without its host syncs on every micro-batch.

TRL's SFTTrainer.compute_loss turns entropy, token accuracy and the token count
into Python floats (`.item()`) on every micro-batch, and HF Trainer checks each
micro-batch's loss for NaN on the host. Each of these waits for the GPU, so the
CPU cannot queue the next micro-batch's kernels while the GPU works: on a fast
GPU the launch overhead of a LoRA model (hundreds of small ops per layer) is
then paid in full, every micro-batch. Here the same numbers are kept as GPU
tensors and turned into floats once per logging step, where TRL's `log` reads
them; the loss itself is TRL's (`fused_lm_head`, summed per-token NLL over the
batch's label tokens). Any setting this simple path does not cover (a custom
loss, label smoothing, MoE aux loss, sequence parallelism, eval) goes to TRL.
"""

from __future__ import annotations

from types import MethodType
from typing import Any


def install(trainer) -> None:
    """Give one SFTTrainer instance the sync-free training loss (bound methods, TRL's class untouched)."""
    trainer._medgpt_pending = []
    trainer.compute_loss = MethodType(_compute_loss, trainer)
    trainer.log = MethodType(_log, trainer)
    # HF's NaN filter syncs on every micro-batch and hides a NaN loss from the logs; our telemetry
    # flags NaN/Inf from the logged loss, which must therefore show it.
    trainer.args.logging_nan_inf_filter = False


def _plain(trainer) -> bool:
    parallelism = getattr(trainer.accelerator, "parallelism_config", None)
    return (trainer.model.training and trainer.compute_loss_func is None and trainer.label_smoother is None
            and not trainer.aux_loss_enabled and trainer.args.loss_type == "nll"
            and not (parallelism is not None and getattr(parallelism, "sp_enabled", False)))


def _compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
    import torch
    from trl import SFTTrainer

    if return_outputs or not _plain(self):
        return SFTTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
    inputs["use_cache"] = False
    outputs = model(**inputs, fused_lm_head=True)
    num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
    loss = (-outputs.log_probs).sum() / torch.as_tensor(num_tokens).clamp(min=1)
    if self.args.average_tokens_across_devices and num_items_in_batch is not None:
        loss = loss * (self.accelerator.num_processes // self.get_tp_size())
    seen = self.__dict__.pop("_medgpt_batch_tokens", None)  # packed rows' real tokens (stages/packing.py)
    if seen is None:
        seen = inputs["attention_mask"].sum() if "attention_mask" in inputs else inputs["position_ids"].new_tensor(
            inputs["position_ids"].size(1))
    self._medgpt_pending.append(torch.stack([
        outputs.label_mask.sum().float(), outputs.entropy.detach().sum().float(),
        outputs.is_top1.sum().float(), seen.float()]))
    return loss


def _log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
    import torch
    from trl import SFTTrainer

    if self._medgpt_pending:
        # One gather and one host copy per logging step; every rank logs at the same steps.
        rows = self.accelerator.gather(torch.stack(self._medgpt_pending)[None])
        self._medgpt_pending = []
        per_batch = rows.sum(0).tolist()  # [micro-batches, 4], summed over ranks like TRL's gathers
        for valid, entropy, correct, seen in per_batch:
            self._metrics["train"]["entropy"].append(entropy / valid if valid > 0 else 0.0)
            self._metrics["train"]["mean_token_accuracy"].append(correct / valid if valid > 0 else 0.0)
            self._total_train_tokens += int(seen) // self._tp_size
        self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
    SFTTrainer.log(self, logs, start_time)
