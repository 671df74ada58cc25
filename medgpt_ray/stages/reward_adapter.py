"""The rm stage's reward as an adapter on the online-RL stage's own base (`reward_shared_base`: no second network).

When rm trains with LoRA/QLoRA from the model rloo/grpo start from, its reward model is that base + the rm's LoRA
adapter + its score head. Two merged 7B networks (~15 GB each in bf16) never share a 24 GB card; one base with two
adapters does:

  rm keeps   <rm out>/reward_adapter/ (save_reward_adapter, rank 0, beside the merged model/ that stays as it was):
             PEFT's adapter files of the rm's trainer retargeted to the causal LM (task CAUSAL_LM, no
             modules_to_save: the LoRA weights alone), score.safetensors (the score head) and base.json (the base
             model directory it was trained on, and its method).
  rloo loads the base once (the policy, with its trainable LoRA adapter "default"); SharedBaseScore.attach loads the
             reward adapter into that PeftModel as a second, frozen, inactive adapter ("reward"). Scoring is PEFT's
             mixed-batch forward (`adapter_names=["reward"] * n`): the base + the reward adapter only, in eval mode,
             no grad, the active adapter and every requires_grad untouched. The reference of the KL term is TRL's
             adapter-off policy: every adapter off.

A score is what RewardModelScore gives on the rm's merged model: prompt + completion + EOS, right-padded, the final
hidden state (after the last norm) of the last non-pad token through the score head."""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medgpt_ray.memory.generation import SCORING_BATCH  # as RewardModelScore's: what the planner plans one forward of
from medgpt_ray.stages.rewards import completion_text
from medgpt_ray.stages.score_head import fp32_linears

REWARD_ADAPTER = "reward_adapter"  # under the rm stage's output directory
ADAPTER_NAME = "reward"  # the reward adapter's name in the policy's PeftModel
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SCORE_FILE = "score.safetensors"
BASE_FILE = "base.json"


def _is_score_key(key: str) -> bool:
    """A weight of the score head (modules_to_save=["score"], models.lora_config), not a LoRA weight."""
    parts = key.split(".")
    return len(parts) >= 2 and parts[-2] == "score"


def save_reward_adapter(adapter_dir: Path, rm_out: Path, base_model: str, method: str) -> Path:
    """<rm_out>/reward_adapter/ from the rm trainer's saved adapter (`adapter_dir`, trainer.save_model's: LoRA
    weights + the score head as modules_to_save); written whole (a temporary directory renamed)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    config.update(task_type="CAUSAL_LM", modules_to_save=None)  # loaded onto the causal LM: LoRA weights only
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    head = {k.rsplit(".", 1)[1]: v for k, v in weights.items() if _is_score_key(k)}
    if "weight" not in head:
        raise ValueError(f"rm: the adapter saved in {adapter_dir} holds no score head weights (modules_to_save "
                         f"score): no reward adapter can be kept")
    final, tmp = rm_out / REWARD_ADAPTER, rm_out / f"{REWARD_ADAPTER}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in weights.items() if not _is_score_key(k)},
              str(tmp / "adapter_model.safetensors"))
    save_file({k: v.contiguous() for k, v in head.items()}, str(tmp / SCORE_FILE))
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (tmp / BASE_FILE).write_text(json.dumps({"base_model": str(Path(base_model).resolve()), "method": method},
                                            indent=2), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def reward_adapter_for(rm_model: str, policy_base: str, stage: str) -> Path:
    """The reward adapter kept beside the rm stage's merged model `rm_model`, checked: all its files there, trained
    on `policy_base` (the model this stage starts from). ValueError saying what is wrong and what to do."""
    where = Path(rm_model).parent / REWARD_ADAPTER
    missing = [f for f in (*ADAPTER_FILES, SCORE_FILE, BASE_FILE) if not (where / f).is_file()]
    if missing:
        raise ValueError(f"stages.{stage}.reward_shared_base: the rm stage's output {where.parent} has no reward "
                         f"adapter ({', '.join(missing)} missing under {where}); rm keeps one when it trains with "
                         f"LoRA/QLoRA. Rerun rm (--from-stage rm), or set stages.{stage}.reward_shared_base: false "
                         f"to score with its merged model")
    trained_on = json.loads((where / BASE_FILE).read_text(encoding="utf-8"))["base_model"]
    if Path(trained_on).resolve() != Path(policy_base).resolve():
        raise ValueError(f"stages.{stage}.reward_shared_base: the rm stage's adapter was trained on {trained_on}, "
                         f"and this stage starts from {policy_base}: an adapter applies to its own base only. Start "
                         f"both from the same stage, or set stages.{stage}.reward_shared_base: false")
    return where


class SharedBaseScore:
    """The `reward_model` reward on the policy's own base: TRL's reward-function signature, batched, no grad.
    Built before the trainer (it is one of the trainer's reward functions); `attach` it to the trainer's PeftModel
    before training. `tokenizer_dir`: the rm stage's merged model directory (its tokenizer, as RewardModelScore)."""

    def __init__(self, adapter_dir: Path, tokenizer_dir: str, batch_size: int = SCORING_BATCH):
        self.adapter_dir, self.tokenizer_dir, self.batch_size = Path(adapter_dir), tokenizer_dir, batch_size
        self.__name__ = "reward_model"  # TRL logs rewards/<__name__>/mean, as for RewardModelScore
        self.model: Any = None
        self.head: Any = None
        self._tok: Any = None
        self._backbone: Any = None

    def attach(self, model: Any) -> None:
        """Load the reward adapter into `model` (the policy's PeftModel) as a frozen, inactive second adapter, and
        the score head beside it (held here, not in the model: neither trained nor saved with the policy)."""
        import torch
        from peft import PeftModel
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        if not isinstance(model, PeftModel):
            raise TypeError(f"reward_shared_base: the policy is a {type(model).__name__}, not a LoRA (PEFT) model: "
                            f"the reward adapter shares a frozen base only with a LoRA/QLoRA policy")
        device, was_training = model.get_input_embeddings().weight.device, model.training
        model.load_adapter(str(self.adapter_dir), adapter_name=ADAPTER_NAME, is_trainable=False,
                           torch_device=str(device))
        model.train(was_training)  # a frozen adapter's load_adapter puts the whole model in eval mode
        # The policy's checkpoints and output adapter hold the policy's adapters only (PEFT saves every adapter).
        policy = [a for a in model.peft_config if a != ADAPTER_NAME]
        model.save_pretrained = functools.partial(model.save_pretrained, selected_adapters=policy)
        head = load_file(str(self.adapter_dir / SCORE_FILE))
        out_features, hidden = head["weight"].shape
        # fp32 whatever the base's dtype: the bf16 hidden states upcast, scores not rounded to bf16's 8 bits
        # (stages/score_head.py).
        self.head = fp32_linears(torch.nn.Linear(hidden, out_features, bias="bias" in head, dtype=torch.float32,
                                                 device=device))
        self.head.load_state_dict(head)
        self.head.requires_grad_(False)
        base = model.get_base_model()
        self._backbone = getattr(base, base.base_model_prefix)  # the decoder stack: its output is the final norm's
        self._tok = AutoTokenizer.from_pretrained(self.tokenizer_dir, local_files_only=True)
        self.model = model

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        import torch

        if self.model is None:
            raise RuntimeError("SharedBaseScore: attach() it to the policy's PeftModel before scoring")
        eos = self._tok.eos_token or ""
        texts = [completion_text(p) + completion_text(c) + eos for p, c in zip(prompts, completions, strict=True)]
        was_training = self.model.training
        self.model.eval()  # PEFT's mixed-batch forward refuses training mode; no dropout in the reward adapter
        try:
            with torch.no_grad():
                return [s for i in range(0, len(texts), self.batch_size)
                        for s in self._score(texts[i:i + self.batch_size])]
        finally:
            self.model.train(was_training)

    def _score(self, texts: list[str]) -> list[float | None]:
        import torch

        batch = self._tok(texts, return_tensors="pt", padding=True, padding_side="right",
                          add_special_tokens=False).to(self.head.weight.device)
        seen: dict[str, Any] = {}

        def keep(module: Any, args: Any, out: Any) -> None:
            seen["hidden"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

        hook = self._backbone.register_forward_hook(keep)
        # The base + the reward adapter only; the LM head on one position (its logits are not used). PEFT's
        # mixed-batch path casts each adapted input to the adapter's dtype itself: a bf16 base with fp32 adapters
        # needs no autocast, also with stages/speed.py's Bf16LoraInputs (PEFT's input cast off) during training.
        try:
            self.model(**batch, adapter_names=[ADAPTER_NAME] * len(texts), logits_to_keep=1, use_cache=False)
        finally:
            hook.remove()
        ids = batch["input_ids"]
        # The last non-pad token, as transformers' sequence classification picks it.
        positions = torch.arange(ids.shape[1], device=ids.device)
        last = (positions * (ids != self._tok.pad_token_id)).argmax(-1)
        hidden = seen["hidden"][torch.arange(len(texts), device=ids.device), last]
        return self.head(hidden)[:, 0].tolist()  # Fp32Linear: fp32 in, fp32 out
