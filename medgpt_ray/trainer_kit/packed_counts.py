"""What a trainer on packed rows counts (trainer_kit/packed_rows.py): the real tokens and the examples of every
micro-batch, which the collator puts in the batch under TOKENS_KEY and CONVERSATIONS_KEY and which are taken out
here before the model sees the batch. Tokens go to `state.num_input_tokens_seen` (gathered over the ranks, as HF's
own count is; HF's counter is off for packed stages) and the examples per optimizer step are logged as
`<unit>_per_step`."""

from __future__ import annotations

from typing import Any

import torch

from medgpt_ray.trainer_kit.packed_rows import CONVERSATIONS_KEY, TOKENS_KEY


class PackedCounts:
    """Constructor keyword: `packed_unit`, what an example is ("conversations", "pairs"). After each training_step
    `packed_batch_tokens` holds this rank's real tokens of the micro-batch, for the loss's own token count
    (SyncFreeLoss, PackedRewardTrainer), which takes it."""

    def __init__(self, *args: Any, packed_unit: str = "conversations", **kwargs: Any):
        self.packed_unit = packed_unit
        self.packed_examples = 0
        self.packed_last: tuple[int, int] | None = None  # (step, examples) at the last log
        self.packed_batch_tokens: torch.Tensor | None = None
        super().__init__(*args, **kwargs)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        # `inputs` is the loop's own dict: HF's token counter (off for packed stages) and FLOPs count read it after.
        counts = torch.stack([inputs.pop(TOKENS_KEY), inputs.pop(CONVERSATIONS_KEY)]).to(self.args.device)
        tokens, examples = self.accelerator.gather(counts[None]).sum(0).tolist()
        if self.packed_last is None:  # the attempt's first micro-batch (a resumed one starts mid-way)
            self.packed_last = (self.state.global_step, 0)
        self.state.num_input_tokens_seen += int(tokens)
        self.packed_examples += int(examples)
        self.packed_batch_tokens = counts[0]
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen  # as HF logs it when it counts
        if "loss" in logs and self.packed_last is not None:
            step, examples = self.packed_last
            if self.state.global_step > step:
                logs[f"{self.packed_unit}_per_step"] = (self.packed_examples - examples) / (
                    self.state.global_step - step)
                self.packed_last = (self.state.global_step, self.packed_examples)
        super().log(logs, start_time)
