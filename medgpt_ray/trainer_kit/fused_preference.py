"""ORPO's and SimPO's (CPO's) concatenated forward on TRL's chunked LM head (issue 49 item 4). TRL's experimental
ORPOTrainer and CPOTrainer run the chosen and rejected rows through the model's full logits, then a log-softmax over
the whole vocabulary for the answers' log-probabilities and a cross-entropy over it for the NLL term. Everything their
losses read is a per-token log-probability of the next real token, so one pass through TRL's own fused head
(trl.trainer.utils.add_fused_lm_head, as sft, dpo, kto, grpo and rloo already use it: the head projected in tiles,
no [tokens x vocabulary] logits) gives the same losses and gradients:

- the answers' log-probability, summed or (ORPO, SimPO, IPO) averaged over the answer's tokens;
- the NLL term: ORPO's over the chosen row's prompt and answer (its attention mask), CPO's over the chosen answer
  (its labels), as the mean of the negative log-probabilities, as CrossEntropyLoss computes it.

The `logits/chosen` and `logits/rejected` metrics become the mean logit over the scored positions (the unfused
trainers average over every position, padding and prompt included); no loss reads them. Encoder-decoder models and a
router's auxiliary loss keep TRL's own forward."""

from __future__ import annotations

from typing import Any

import torch

OUTPUTS = ("log_probs", "mean_logits")  # what add_fused_lm_head computes for these trainers
# TRL's CPO loss types on the answers' mean log-probability (its get_batch_logps' average_log_prob), TRL's words
AVERAGED_LOSS_TYPES = ("ipo", "simpo")


def add_fused_head(model: Any) -> None:
    """TRL's fused head on a causal LM, before PEFT wraps it (its own instruction); the plain forward is unchanged."""
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=OUTPUTS)


# The concatenated keys' padding: the ids' with the trainer's padding value, the mask's and the labels' as TRL pads them
PAD_VALUES = {"concatenated_attention_mask": 0, "concatenated_labels": -100}


def bucketed(cb: dict[str, Any], multiple: int | None, padding_value: int) -> dict[str, Any]:
    """The concatenated batch padded on the right to a multiple of `multiple` tokens (None: as it is), so compiled
    layers see a few lengths, not one per micro-batch's longest pair (TRL's ORPO and CPO collators pad to that, with
    no `pad_to_multiple_of`). The padding is masked and labelled -100: no loss reads it."""
    from trl.experimental.utils import pad_to_length

    width = cb["concatenated_input_ids"].shape[1]
    if not multiple or width % multiple == 0:
        return cb
    target = -(-width // multiple) * multiple
    return {k: pad_to_length(v, target, PAD_VALUES.get(k, padding_value))
            if k in ("concatenated_input_ids", *PAD_VALUES) and isinstance(v, torch.Tensor) else v
            for k, v in cb.items()}


def _pass(trainer: Any, model: Any, batch: dict[str, Any], padding_value: int
          ) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """(the concatenated batch as the trainer's own forward builds it, bucketed where the layers are compiled, each
    next real token's log-probability [2B, L - 1] (0 elsewhere), the mean logit at those positions)."""
    cb = trainer.concatenated_inputs(batch, is_encoder_decoder=False, padding_value=padding_value,
                                     device=trainer.accelerator.device)
    cb = bucketed(cb, trainer.pad_to_multiple_of, padding_value)
    ids, mask = cb["concatenated_input_ids"], cb["concatenated_attention_mask"]
    out = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), use_cache=False,
                fused_lm_head=True)
    return cb, out.log_probs, out.mean_logits


def _mean(logps: torch.Tensor, where: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    total = (logps * where).sum() if dim is None else (logps * where).sum(dim)
    return total / (where.sum() if dim is None else where.sum(dim))


class _FusedPairs:
    """The shared concatenated forward: TRL's own where the fused head does not apply, else one fused pass and the
    subclass's reading of its per-token log-probabilities."""

    pad_to_multiple_of: int | None = None  # set by the stage where its layers are compiled (bucket_kwargs)

    def concatenated_forward(self, model, batch):
        if self.is_encoder_decoder or self.aux_loss_enabled:
            return super().concatenated_forward(model, batch)
        cb, logps, mean_logits = _pass(self, model, batch, self._padding_value())
        n = batch["chosen_labels"].shape[0]
        answer = cb["concatenated_labels"][:, 1:] != -100  # get_batch_logps' mask
        per_row, nll = self._losses(cb, logps, answer, n)
        return per_row[:n], per_row[n:], mean_logits[:n], mean_logits[n:], nll


class FusedORPO(_FusedPairs):
    """Mixed in before ORPOTrainer (trl.experimental.orpo): answers averaged, the NLL over the chosen row's prompt
    and answer."""

    def _padding_value(self) -> int:
        return self.padding_value

    def _losses(self, cb, logps, answer, n):
        real = cb["concatenated_attention_mask"][:, 1:] == 1  # the NLL's targets: prompt and answer
        return _mean(logps, answer, dim=-1), -_mean(logps[:n], real[:n])


class FusedCPO(_FusedPairs):
    """Mixed in before CPOTrainer (trl.experimental.cpo; SimPO is its loss_type "simpo"): answers averaged or summed
    by loss type, the NLL over the chosen answer when cpo_alpha is not 0."""

    def _padding_value(self) -> int:
        return self.pad_token_id

    def _losses(self, cb, logps, answer, n):
        per_row = (_mean(logps, answer, dim=-1) if self.loss_type in AVERAGED_LOSS_TYPES
                   else (logps * answer).sum(-1))
        nll = (-_mean(logps[:n], answer[:n]) if self.cpo_alpha != 0
               else torch.tensor(0.0, device=self.accelerator.device))
        return per_row, nll
