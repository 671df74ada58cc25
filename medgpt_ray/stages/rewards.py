"""The online-RL stages' reward functions, selectable by name in `stages.grpo.reward_funcs` (and rloo's), in TRL's
signature `f(prompts, completions, completion_ids, **columns) -> list[float | None]` (a None is a reward that does
not apply: TRL leaves it out of the means):

  accuracy      1.0 when the completion's answer matches the record's reference answer (stages/answer_match.py:
                normalised exact or numeric match, Chinese-aware), else 0.0; None for a record without one.
  format        1.0 for <think>…</think><answer>…</answer> (nothing else around them), else 0.0.
  length        a soft penalty: 0.0 up to `length_target` completion tokens, then falling linearly to -1.0 at
                max_completion_length.
  reward_model  the score of a finished rm stage's model (stages.<kind>.needs rm) on prompt + completion; rloo's
                reward always.

Any other entry is a custom function by import path, "package.module:function" (or "package.module.function"),
called with the same arguments."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from medgpt_ray.memory.generation import SCORING_BATCH  # what the planner plans one scoring forward of
from medgpt_ray.stages.answer_match import answers_match, extract_answer
from medgpt_ray.stages.score_head import fp32_score_head

RewardFunc = Callable[..., list[float | None]]
BUILTIN_REWARDS = ("accuracy", "format", "length", "reward_model")
FORMAT_RE = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def completion_text(completion: Any) -> str:
    """A completion as text: TRL passes strings for text prompts and [assistant message] for conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def accuracy(completions: Sequence[Any], answer: Sequence[str | None] | None = None,
             **kwargs: Any) -> list[float | None]:
    """1.0 when the extracted answer matches the reference, 0.0 when not, None without a reference."""
    refs = list(answer) if answer is not None else [None] * len(completions)
    return [None if ref is None else float(answers_match(extract_answer(completion_text(c)), ref))
            for c, ref in zip(completions, refs, strict=True)]


def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 for exactly <think>…</think><answer>…</answer>, else 0.0 (MedicalGPT's format reward)."""
    return [1.0 if FORMAT_RE.match(completion_text(c)) else 0.0 for c in completions]


format_reward.__name__ = "format"  # TRL logs rewards/<__name__>/mean


def length_penalty(target: int, limit: int) -> RewardFunc:
    """0.0 for completions of at most `target` tokens, then linearly down to -1.0 at `limit` tokens."""
    span = max(limit - target, 1)

    def length(completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None = None,
               **kwargs: Any) -> list[float | None]:
        counts = [len(ids) for ids in completion_ids] if completion_ids is not None else \
            [len(completion_text(c)) for c in completions]
        return [-min(max(n - target, 0) / span, 1.0) for n in counts]

    return length


class RewardModelScore:
    """The score head of a finished rm stage's merged model on prompt + completion (+ EOS), batched, no grad.
    Loaded on first use, on `device` (the policy's, set by the stage)."""

    def __init__(self, model_dir: str, batch_size: int = SCORING_BATCH, device: str = "cpu"):
        self.model_dir, self.batch_size, self.device = model_dir, batch_size, device
        self.__name__ = "reward_model"  # TRL logs rewards/<__name__>/mean
        self._model: Any = None
        self._tok: Any = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from medgpt_ray.models import without_zero3_init

        self._tok = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        # A whole copy on every worker (what the planner sizes), also when the policy trains under ZeRO-3: built
        # under its zero.Init the network would be partitioned with no engine to gather it for a forward.
        with without_zero3_init():
            self._model = AutoModelForSequenceClassification.from_pretrained(
                self.model_dir, num_labels=1, dtype=dtype, local_files_only=True).to(self.device).eval()
        self._model.config.pad_token_id = self._tok.pad_token_id
        # Scores in fp32 from the bf16 network's hidden states: bf16 scores of a few hundred are 2 apart, and the
        # advantages are differences of them (stages/score_head.py).
        fp32_score_head(self._model)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        import torch

        if self._model is None:
            self._load()
        eos = self._tok.eos_token or ""
        texts = [completion_text(p) + completion_text(c) + eos for p, c in zip(prompts, completions, strict=True)]
        scores: list[float | None] = []
        for i in range(0, len(texts), self.batch_size):
            batch = self._tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True, padding_side="right",
                              add_special_tokens=False).to(self.device)
            with torch.no_grad():
                scores += self._model(**batch).logits[:, 0].float().tolist()
        return scores


def import_reward(path: str) -> RewardFunc:
    """A custom reward function by import path: "package.module:function" or "package.module.function"."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward function {path!r}: not one of {', '.join(BUILTIN_REWARDS)} nor an import path "
                         f"'package.module:function'")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward function {path!r}: cannot import it ({e})") from None
    if not callable(func):
        raise ValueError(f"reward function {path!r}: {type(func).__name__} is not callable")
    return func


def clipped(func: RewardFunc, low: float, high: float) -> RewardFunc:
    """`func` with each value clipped to [low, high] (grpo's reward_clip_range: TRL's GRPOTrainer has no clipping of
    its own); a None (a reward that does not apply) stays None. Its name kept (TRL logs rewards/<__name__>/mean),
    the unclipped function as __wrapped__."""

    def clip(*args: Any, **kwargs: Any) -> list[float | None]:
        return [None if v is None else min(max(float(v), low), high) for v in func(*args, **kwargs)]

    clip.__name__ = getattr(func, "__name__", type(func).__name__)
    clip.__wrapped__ = func  # type: ignore[attr-defined]
    return clip


def reward_functions(names: Sequence[str], *, length_target: int, max_completion_length: int,
                     reward_model_dir: str | None = None, device: str = "cpu", stage: str,
                     remote: RewardFunc | None = None, clip: Sequence[float] | None = None) -> list[RewardFunc]:
    """The reward functions `stages.<stage>.reward_funcs` names, in its order; `remote`, when given, is the
    reward_model reward (a scorer whose model is held elsewhere: run/reward_actor.py, or the rm's adapter on the
    policy's own base: stages/reward_adapter.py), else the rm's merged model is loaded here. `clip` [min, max]:
    each function's values clipped to it (clipped)."""
    out = _named_rewards(names, length_target, max_completion_length, reward_model_dir, device, stage, remote)
    return out if clip is None else [clipped(f, clip[0], clip[1]) for f in out]


def _named_rewards(names: Sequence[str], length_target: int, max_completion_length: int,
                   reward_model_dir: str | None, device: str, stage: str,
                   remote: RewardFunc | None) -> list[RewardFunc]:
    out: list[RewardFunc] = []
    for name in names:
        if name == "accuracy":
            out.append(accuracy)
        elif name == "format":
            out.append(format_reward)
        elif name == "length":
            out.append(length_penalty(length_target, max_completion_length))
        elif name == "reward_model" and remote is not None:
            out.append(remote)
        elif name == "reward_model":
            if reward_model_dir is None:
                raise ValueError(f"reward_funcs: reward_model needs the output of a finished rm stage "
                                 f"(stages.{stage}.needs: [rm])")
            out.append(RewardModelScore(reward_model_dir, device=device))
        else:
            out.append(import_reward(name))
    return out
