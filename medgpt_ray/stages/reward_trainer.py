"""The reward trainer of packed pairs: TRL's RewardTrainer whose training loss reads packed pair rows
(stages/reward_packing.py says how they are made and why the loss is TRL's). Imported by the rm stage's worker only:
it imports TRL."""

from __future__ import annotations

from typing import Any

import torch
from trl import RewardTrainer

from medgpt_ray.stages.reward_packing import ENDS_KEY, PACKED_COLUMNS
from medgpt_ray.stages.score_head import score_head
from medgpt_ray.trainer_kit.packed_rows import TOKENS_KEY


class PackedRewardTrainer(RewardTrainer):
    """TRL's RewardTrainer whose training batches are packed pair rows (PairRowsCollator, the shard loader's train
    collate; rm composes it with PackedCounts and ShardLoader); evaluation batches are TRL's own and go to TRL's
    compute_loss."""

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        if "seq_lengths" in getattr(dataset, "column_names", ()):  # packed rows: already tokenized
            return dataset
        return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *PACKED_COLUMNS]))

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        if ENDS_KEY not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        seen: dict[str, torch.Tensor] = {}
        hook = score_head(model).register_forward_hook(lambda module, args, out: seen.__setitem__("scores", out))
        try:
            model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False)
        finally:
            hook.remove()
        rewards = seen["scores"].reshape(-1)[inputs[ENDS_KEY]]  # num_labels 1: one score per position
        rewards_chosen, rewards_rejected = rewards[0::2], rewards[1::2]
        loss = -torch.nn.functional.logsigmoid(rewards_chosen - rewards_rejected).mean()
        if self.args.center_rewards_coefficient is not None:
            loss += self.args.center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
        logits = torch.cat([rewards_chosen, rewards_rejected])[:, None]  # TRL's order: chosen, then rejected
        self._log_pair_metrics(inputs, logits, rewards_chosen, rewards_rejected)
        return (loss, {"logits": logits}) if return_outputs else loss

    def _log_pair_metrics(self, inputs: dict[str, Any], logits: torch.Tensor, rewards_chosen: torch.Tensor,
                          rewards_rejected: torch.Tensor) -> None:
        """TRL's RewardTrainer metrics, with num_tokens the micro-batch's real tokens."""
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            # This rank's, handed over by PackedCounts' training_step (trainer_kit/packed_counts.py).
            real, self.packed_batch_tokens = getattr(self, "packed_batch_tokens", None), None
            real = inputs[TOKENS_KEY] if real is None else real  # a batch given to compute_loss directly
            self._total_train_tokens += self.accelerator.gather_for_metrics(real).sum().item() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        with torch.no_grad():
            all_rewards = self.accelerator.gather(logits)
            self._metrics[mode]["min_reward"].append(all_rewards.min().item())
            self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
            self._metrics[mode]["max_reward"].append(all_rewards.max().item())
            accuracy = (rewards_chosen > rewards_rejected).float().mean()
            self._metrics[mode]["accuracy"].append(self.accelerator.gather_for_metrics(accuracy).mean().item())
            margin = (rewards_chosen - rewards_rejected).mean()
            self._metrics[mode]["margin"].append(self.accelerator.gather_for_metrics(margin).mean().item())
