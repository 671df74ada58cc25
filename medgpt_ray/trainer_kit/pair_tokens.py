"""Tokens/s for TRL's ORPO and CPO trainers (orpo, simpo): their batches carry chosen_/rejected_ sequences and no
input_ids, so HF's token counter finds nothing to count (0 tokens/s). PairTokenCount counts the real tokens of both
sequences of every pair (prompt included, as DPO's count does), gathered over the ranks as HF's own count is; the
stage's config turns HF's counter off."""

from __future__ import annotations

from typing import Any


class PairTokenCount:
    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        import torch

        real = sum(inputs[k].sum() for k in ("chosen_attention_mask", "rejected_attention_mask") if k in inputs)
        if isinstance(real, torch.Tensor):
            self.state.num_input_tokens_seen += int(self.accelerator.gather(real.reshape(1)).sum().item())
        return super().training_step(model, inputs, num_items_in_batch)
