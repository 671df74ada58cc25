"""GKD's loss without either model's logits (issue 49 item 1). TRL's GKDTrainer.compute_loss materialises the
student's and the teacher's logits over the whole vocabulary and the generalized JSD over them (~62 bytes a logit
measured: a second 1,024-token sequence in a 1.5B student's micro-batch costs ~12 GiB). Here both models stop at their
last hidden state and TRL's own ChunkedDivergenceFunction (trl/kernels/chunked_divergence.py, what
trl.DistillationTrainer runs) projects them through the two heads on tiles, the answer tokens only: the same loss as
GKDTrainer.generalized_jsd_loss (temperature 1, as GKD computes it; the stage's temperature is for sampling), the
same reduction (by `num_items_in_batch` where the Trainer gives it, else the micro-batch's answer tokens), and no
gradient for a frozen head.

Both heads are cut to the tokenizer's length: checkpoints pad their heads past the tokenizer (Qwen2.5-7B's has
152,064 rows, 1.5B's 151,936, for the same 151,665 tokens), and no token beyond it is ever a target or sampled."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

HIDDEN_ONLY = "medgpt_last_hidden_only"  # the keyword the student's forward returns its last hidden state for


def add_hidden_state_output(model: Any) -> None:
    """Let `model(..., medgpt_last_hidden_only=True)` return the decoder's last hidden state [B, L, H] and no logits;
    without it the forward is the original one (generation is unchanged). Patched on the causal LM before PEFT wraps
    it, as TRL's add_fused_lm_head is, so the call goes through DDP's and PEFT's wrappers: DDP's gradient sync hooks
    in at its own forward, which a call to the inner decoder would skip."""
    original = model.forward

    @functools.wraps(original)  # generate validates its model kwargs against the original signature
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.pop(HIDDEN_ONLY, False):
            return original(*args, **kwargs)
        # PEFT hands on the causal LM's own arguments: the decoder takes no labels, and the Nones are defaults
        kept = {k: v for k, v in kwargs.items() if v is not None and k != "labels"}
        return model.base_model(*args, **{**kept, "use_cache": False}).last_hidden_state

    model.forward = forward


def backbone(model: Any) -> Any:
    """The decoder stack under a causal LM (peft's wrapper and the head left out): it returns the last hidden state."""
    if hasattr(model, "get_base_model"):  # a PeftModel: its LoRA layers sit inside the decoder it returns
        model = model.get_base_model()
    return model.base_model


def head_weight(model: Any, vocab: int) -> torch.Tensor:
    """The output head's first `vocab` rows (a view: a trained head's gradient reaches the parameter)."""
    head = model.get_output_embeddings()
    if head is None or not torch.is_floating_point(head.weight) or head.weight.dim() != 2:
        raise ValueError(f"opd: {type(model).__name__}'s output head is not a plain [vocab, hidden] weight "
                         f"({type(head).__name__}); the chunked divergence projects through it")
    if getattr(head, "bias", None) is not None:
        raise ValueError(f"opd: {type(model).__name__}'s output head has a bias; the families opd plans have none")
    if head.weight.shape[0] < vocab:
        raise ValueError(f"opd: {type(model).__name__}'s head has {head.weight.shape[0]} rows, fewer than the "
                         f"tokenizer's {vocab} tokens")
    return head.weight[:vocab]


def last_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L - 1, H]: each position's state that predicts the next token, of a model no wrapper trains (the
    teacher)."""
    out = backbone(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.last_hidden_state[:, :-1]


def chunked_jsd(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, student_head: torch.Tensor,
                teacher_head: torch.Tensor, labels: torch.Tensor, beta: float,
                num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, labels, beta, num_items_in_batch=...) for the
    logits these hidden states and heads would give, without them. `labels` [B, L - 1] are the shifted targets
    (-100: not a target)."""
    from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

    valid = labels.reshape(-1) != -100
    h_s = student_hidden.reshape(-1, student_hidden.shape[-1])[valid]
    h_t = teacher_hidden.reshape(-1, teacher_hidden.shape[-1])[valid].to(h_s.device)
    per_token, _ = ChunkedDivergenceFunction.apply(h_s, student_head, None, h_t, teacher_head.to(h_s.device), None,
                                                   float(beta))
    total = per_token.sum()
    if num_items_in_batch is None:
        return total / valid.sum().clamp_min(1)  # GKD's batchmean: a micro-batch of no answer token is a finite 0
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class ChunkedJSD:
    """Mixed in before GKDTrainer: its compute_loss on the chunked divergence. Everything else (on-policy sampling
    with probability lmbda, the collator's labels, evaluation's loss) stays GKDTrainer's. Under DeepSpeed ZeRO-3 both
    heads are partitioned to empty tensors outside their modules' forward, so GKDTrainer's own loss runs there (as
    the plan prices it: kinds/opd/memory.py)."""

    vocab_size: int  # set by the stage: len(tokenizer), what both heads are cut to

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        student = model(input_ids=ids, attention_mask=mask, **{HIDDEN_ONLY: True})[:, :-1]  # through DDP and PEFT
        self.teacher_model.eval()
        with torch.no_grad():
            teacher = last_hidden(self.teacher_model, ids, mask)
        loss = chunked_jsd(student, teacher, head_weight(_unwrapped(model), self.vocab_size),
                           head_weight(self.teacher_model, self.vocab_size), inputs["labels"][:, 1:], self.beta,
                           num_items_in_batch)
        # No logits to return: evaluation runs with prediction_loss_only, and a dict of none gives the Trainer none.
        return (loss, {}) if return_outputs else loss


def _unwrapped(model: Any) -> Any:
    """The model under DDP's or DeepSpeed's wrapper (get_output_embeddings lives on the model itself)."""
    return getattr(model, "module", model)


@contextmanager
def heads_cut_for_trl(teacher: Any, student: Any, vocab: int, zero3: bool) -> Iterator[None]:
    """While GKDTrainer is built: TRL 1.16's __init__ refuses a teacher whose config's vocab_size differs from the
    student's, because its own loss compares the whole heads. ChunkedJSD compares only their first `vocab` rows
    (len(tokenizer); the driver checked both tokenize alike), so for that check the teacher's config reads as the
    student's, and is restored after. Under ZeRO-3 GKDTrainer's own loss runs (ChunkedJSD steps aside): there the
    heads must match, and a pair that does not is refused here with a sentence."""
    t_cfg, s_cfg = teacher.config.get_text_config(), student.config.get_text_config()
    rows = t_cfg.vocab_size
    if rows == s_cfg.vocab_size:
        yield
        return
    if zero3:
        raise ValueError(f"opd: the teacher's head has {rows:,} rows and the student's {s_cfg.vocab_size:,}; under "
                         "ZeRO-3 the stage runs GKDTrainer's own loss over both whole heads, which must match: use "
                         "stages.opd.zero_stage 0, 1 or 2 (the chunked loss cuts both heads to the tokenizer)")
    if min(rows, s_cfg.vocab_size) < vocab:
        raise ValueError(f"opd: a head of {min(rows, s_cfg.vocab_size):,} rows is shorter than the tokenizer's "
                         f"{vocab:,} tokens")
    t_cfg.vocab_size = s_cfg.vocab_size
    try:
        yield
    finally:
        t_cfg.vocab_size = rows
