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

from typing import Any


class SyncFreeLoss:
    """SFTTrainer with the sync-free training loss and its once-per-log metrics. Composed with ShardLoader and, for
    packed rows, PackedCounts (listed before this class: its training_step hands over the rows' real tokens as
    `packed_batch_tokens`, which TRL's num_tokens counts here). `sync_free` false: TRL's own loss (a bench
    compares the two, bench/step_overhead_probe.py)."""

    def __init__(self, *args: Any, sync_free: bool = True, **kwargs: Any):
        self.sync_free = sync_free
        self.pending_metrics: list = []
        self.packed_batch_tokens = None
        super().__init__(*args, **kwargs)
        # HF's NaN filter syncs on every micro-batch and hides a NaN loss from the logs; our telemetry
        # flags NaN/Inf from the logged loss, which must therefore show it.
        self.args.logging_nan_inf_filter = False

    def _plain(self) -> bool:
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        return (self.sync_free and self.model.training and self.compute_loss_func is None
                and self.label_smoother is None and not self.aux_loss_enabled and self.args.loss_type == "nll"
                and not (parallelism is not None and getattr(parallelism, "sp_enabled", False)))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        import torch

        if return_outputs or not self._plain():
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = (-outputs.log_probs).sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        seen, self.packed_batch_tokens = self.packed_batch_tokens, None  # packed rows' real tokens (PackedCounts)
        if seen is None:
            seen = inputs["attention_mask"].sum() if "attention_mask" in inputs else inputs["position_ids"].new_tensor(
                inputs["position_ids"].size(1))
        self.pending_metrics.append(torch.stack([
            outputs.label_mask.sum().float(), outputs.entropy.detach().sum().float(),
            outputs.is_top1.sum().float(), seen.float()]))
        return loss

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        import torch

        if self.pending_metrics:
            # One gather and one host copy per logging step; every rank logs at the same steps.
            rows = self.accelerator.gather(torch.stack(self.pending_metrics)[None])
            self.pending_metrics = []
            per_batch = rows.sum(0).tolist()  # [micro-batches, 4], summed over ranks like TRL's gathers
            for valid, entropy, correct, seen in per_batch:
                self._metrics["train"]["entropy"].append(entropy / valid if valid > 0 else 0.0)
                self._metrics["train"]["mean_token_accuracy"].append(correct / valid if valid > 0 else 0.0)
                self._total_train_tokens += int(seen) // self._tp_size
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        super().log(logs, start_time)
