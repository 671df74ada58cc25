"""The eval stage's model-side measurements, plain torch on a loaded model (no Ray, no generation): held-out loss of
conversations (response tokens only, as SFT trains) and of plain text, the reward model's score of answers, and
each exam option's log-probability after its question. Every sequence is tokenized as training tokenizes it
(templates.encode_sft / encode_preference) and cut at `seq_len`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from medgpt_ray import templates
from medgpt_ray.data.exam import answer_text, candidates, exam_prompt

IGNORE = -100


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def _padded(rows: Sequence[tuple[list[int], list[int]]], pad_id: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids.to(device), labels.to(device), mask.to(device)


def sequence_logprobs(model: Any, rows: Sequence[tuple[list[int], list[int]]], pad_id: int, batch_size: int,
                      chunk_tokens: int = 4096) -> list[tuple[float, int]]:
    """(sum of log p(token), number of tokens) over each row's labelled tokens (labels != -100), right-padded
    batches, no grad. A row is (input_ids, labels). The LM head runs only on the positions that predict a labelled
    token, `chunk_tokens` at a time in fp32: no batch x length x vocabulary logits (152k-word vocabularies)."""
    import torch

    out: list[tuple[float, int]] = []
    device = _device(model)
    decoder, head = getattr(model, model.base_model_prefix), model.get_output_embeddings()
    for start in range(0, len(rows), batch_size):
        ids, labels, mask = _padded(rows[start:start + batch_size], pad_id, device)
        target = labels[:, 1:]
        keep = target != IGNORE
        row_of = keep.nonzero()[:, 0]
        sums = torch.zeros(len(ids), dtype=torch.float64, device=device)
        with torch.no_grad():
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][keep]
            wanted = target[keep]
            for c in range(0, len(wanted), chunk_tokens):
                logits = head(hidden[c:c + chunk_tokens]).float()
                logp = torch.log_softmax(logits, -1).gather(-1, wanted[c:c + chunk_tokens, None]).squeeze(-1)
                sums.index_add_(0, row_of[c:c + chunk_tokens], logp.double())
        out += [(float(v), int(n)) for v, n in zip(sums.tolist(), keep.sum(-1).tolist(), strict=True)]
    return out


def _loss(scored: Iterable[tuple[float, int]], examples: int, skipped: int) -> dict[str, Any]:
    total = n = 0
    for s, k in scored:
        total, n = total + s, n + k
    loss = -total / n if n else None
    return {"loss": None if loss is None else round(loss, 5),
            "perplexity": None if loss is None else round(math.exp(min(loss, 50.0)), 4),
            "tokens": n, "examples": examples, "skipped": skipped}


def conversation_loss(model: Any, tok: Any, template: Any, records: Sequence[dict], seq_len: int, batch_size: int,
                      response_only: bool = True) -> dict[str, Any]:
    """Token-weighted mean loss (and perplexity) of held-out conversations: over the assistant turns as SFT trains
    them (response_only), or over every token. Records that cannot be encoded (no answer within seq_len) are
    skipped and counted."""
    rows, skipped = [], 0
    for r in records:
        try:
            enc = templates.encode_sft(tok, template, r["conversations"], max_len=seq_len, tools=r.get("tools"))
        except templates.TemplateError:
            skipped += 1
            continue
        rows.append((enc["input_ids"], enc["labels"] if response_only else enc["input_ids"]))
    return _loss(sequence_logprobs(model, rows, tok.pad_token_id, batch_size), len(rows), skipped)


def text_loss(model: Any, tok: Any, texts: Sequence[str], seq_len: int, batch_size: int) -> dict[str, Any]:
    """Token-weighted mean loss of held-out pretraining text (each text cut at seq_len, EOS appended as pt trains)."""
    rows = []
    for t in texts:
        ids = tok(t + (tok.eos_token or ""), add_special_tokens=False)["input_ids"][:seq_len]
        if len(ids) >= 2:
            rows.append((ids, ids))
    return _loss(sequence_logprobs(model, rows, tok.pad_token_id, batch_size), len(rows), len(texts) - len(rows))


def reward_scores(rm: Any, tok: Any, template: Any, prompts: Sequence[dict], responses: Sequence[str], seq_len: int,
                  batch_size: int) -> list[float]:
    """The reward model's score of each answer after its prompt, tokenized as the rm stage trains on a pair's
    chosen answer (prompt + answer + end of turn); a sequence over seq_len keeps its last seq_len tokens."""
    import torch

    rows = []
    for p, resp in zip(prompts, responses, strict=True):
        rec = {"conversations": p["conversations"], "chosen": resp, "rejected": resp, "tools": p.get("tools") or []}
        enc = templates.encode_preference(tok, template, rec)
        rows.append((enc["prompt_ids"] + enc["chosen_ids"])[-seq_len:])  # a long prompt loses its start
    scores: list[float] = []
    device = _device(rm)
    for start in range(0, len(rows), batch_size):
        ids, _, mask = _padded([(r, r) for r in rows[start:start + batch_size]], tok.pad_token_id, device)
        with torch.no_grad():
            logits = rm(input_ids=ids, attention_mask=mask).logits[:, 0].float()
        scores += logits.tolist()
    return scores


def exam_option_scores(model: Any, tok: Any, template: Any, records: Sequence[dict], seq_len: int, batch_size: int
                       ) -> list[dict[str, tuple[float, int]]]:
    """Per question, per candidate answer (data/exam.candidates: letters): (sum log p, tokens) of its text
    (data/exam.answer_text) after the question asked as a user turn (data/exam.exam_prompt), the template's
    generation prompt between."""
    rows, where = [], []
    for q, r in enumerate(records):
        prompt = templates.render_prompt(template, tok, [{"role": "user", "content": exam_prompt(r)}])
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        for letters in candidates(r):
            answer = tok(answer_text(r, letters), add_special_tokens=False)["input_ids"][:seq_len - 1]
            ids = (prompt_ids + answer)[-seq_len:]  # a long question loses its start, never the answer
            labels = [IGNORE] * (len(ids) - len(answer)) + answer
            rows.append((ids, labels))
            where.append((q, letters))
    scored = sequence_logprobs(model, rows, tok.pad_token_id, batch_size)
    out: list[dict[str, tuple[float, int]]] = [{} for _ in records]
    for (q, letters), s in zip(where, scored, strict=True):
        out[q][letters] = s
    return out


def loglik_choice(scores: dict[str, tuple[float, int]], normalised: bool = True) -> str:
    """The candidate answer (letters) a model picks by log-likelihood: the best length-normalised one (mean log p
    per token), or by the sum."""
    def value(letters: str) -> float:
        s, n = scores[letters]
        return s / max(n, 1) if normalised else s

    return min(scores, key=lambda letters: (-value(letters), letters))
