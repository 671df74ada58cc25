"""Held-out preference accuracy of a policy trained against a reference (KTO): the share of held-out pairs whose
chosen answer gets the higher implicit reward beta * (log pi(y|x) - log pi_ref(y|x)), summed over the answer's
tokens, the reward TRL's KTO loss is built on. Scored with the trainer's own collator and its model as TRL patched
it (the chunked LM head's per-token log-probabilities, no full logits); the reference is the adapter-off policy
(LoRA) or the trainer's frozen copy (full). Every rank scores the whole held-out set (a few hundred pairs at most),
so all of them report the same number."""

from __future__ import annotations

import contextlib
from typing import Any

from medgpt_ray.stages.outputs import policy_in_eval


def held_out_pairs(records: list[dict]) -> list[dict]:
    """The canonical preference pairs among unpaired held-out records: the two halves of each pair id (a chosen,
    label true, and a rejected, label false), in reading order. Records of no pair are not scored."""
    halves: dict[str, dict[bool, dict]] = {}
    for r in records:
        if "pair" in r:
            halves.setdefault(r["pair"], {})[bool(r["label"])] = r
    pairs = []
    for h in halves.values():
        if True in h and False in h:
            pair = {"conversations": h[True]["conversations"], "chosen": h[True]["completion"],
                    "rejected": h[False]["completion"]}
            pairs.append({**pair, "tools": h[True]["tools"]} if h[True].get("tools") else pair)
    return pairs


def _tokenized(tok: Any, prompt: str, completion: str, label: bool) -> dict[str, Any]:
    """As TRL's KTO tokenizes a non-conversational example: EOS added when missing, the completion where the
    prompt's and the prompt+completion's tokens diverge."""
    if tok.eos_token and not completion.endswith(tok.eos_token):
        completion += tok.eos_token
    prompt_ids, full = tok(prompt)["input_ids"], tok(prompt + completion)["input_ids"]
    n = 0
    while n < min(len(prompt_ids), len(full)) and prompt_ids[n] == full[n]:
        n += 1
    return {"prompt_ids": full[:n], "completion_ids": full[n:], "label": label}


def _completion_logps(trainer: Any, model: Any, batch: dict[str, Any]) -> Any:
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                use_cache=False, fused_lm_head=True)
    return out.log_probs[:, -(batch["input_ids"].size(1) - 1):].sum(-1).float()


def implicit_rewards(trainer: Any, prompts: list[str], completions: list[str], batch_size: int) -> list[float]:
    """beta * (log pi - log pi_ref) of each completion after its prompt."""
    import torch

    tok = trainer.processing_class
    rewards: list[float] = []
    with policy_in_eval(trainer) as model:
        for i in range(0, len(prompts), batch_size):
            rows = [_tokenized(tok, p, c, True) for p, c in zip(prompts[i:i + batch_size],
                                                                 completions[i:i + batch_size], strict=True)]
            batch = {k: v.to(trainer.accelerator.device) for k, v in trainer.data_collator(rows).items()
                     if isinstance(v, torch.Tensor)}
            with torch.no_grad(), trainer.compute_loss_context_manager():
                policy = _completion_logps(trainer, model, batch)
                if trainer.ref_model is not None:
                    reference = _completion_logps(trainer, trainer.ref_model, batch)
                else:
                    with model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext():
                        reference = _completion_logps(trainer, model, batch)
            rewards += (trainer.beta * (policy - reference)).tolist()
    return rewards


def pair_accuracy(trainer: Any, pairs: Any, batch_size: int) -> dict[str, Any]:
    """eval_reward_accuracy (chosen's implicit reward above rejected's), eval_reward_margin (mean difference) and
    eval_pairs over `pairs` (a dataset of rendered prompt/chosen/rejected texts,
    stages/preference_rows.preference_texts)."""
    if pairs is None or len(pairs) == 0:
        return {"eval_reward_accuracy": None, "eval_reward_margin": None, "eval_pairs": 0}
    chosen = implicit_rewards(trainer, pairs["prompt"], pairs["chosen"], batch_size)
    rejected = implicit_rewards(trainer, pairs["prompt"], pairs["rejected"], batch_size)
    diffs = [c - r for c, r in zip(chosen, rejected, strict=True)]
    return {"eval_reward_accuracy": sum(d > 0 for d in diffs) / len(diffs),
            "eval_reward_margin": sum(diffs) / len(diffs), "eval_pairs": len(diffs)}
