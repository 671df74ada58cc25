"""An online-RL stage (TRL's GRPOTrainer or RLOOTrainer, the same constructor) built and run: prompt rows, the
reward functions, the rollout behaviours, and the held-out greedy rewards before and after training. The grpo and
rloo kinds are each their trainer's arguments on top of this.

Data: each worker reads its own shard of the train split (trainer_kit/sharding.py), and the trainer's class has a
loader over that shard (trainer_kit/prompt_shard.py) that repeats every prompt `num_generations` times in a row
(TRL's RepeatSampler order), so every worker's generation batch holds whole groups: TRL gathers the rewards over the
workers and normalises them in contiguous groups of num_generations, which are then each one worker's. Every
worker's epoch is padded to the largest shard's prompt count (the steps stay collective).

Held-out: the mean accuracy reward of greedy completions of the held-out prompts, before training and after
(`eval_accuracy_before`, `eval_accuracy`), with the format reward's mean beside them (and the reward model's mean
score, `eval_reward_model`, when one is among the rewards)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray import models
from medgpt_ray.config import overlong_policy, reward_model_kind
from medgpt_ray.stages.callbacks import stage_callbacks
from medgpt_ray.stages.inputs import BuiltStage, Sink, StageInputs
from medgpt_ray.stages.outputs import HELD_OUT, finish_stage, policy_in_eval, write_result
from medgpt_ray.stages.overlong import LengthTally, prompt_outcome
from medgpt_ray.stages.preference_rows import rendered_prompts
from medgpt_ray.stages.reward_adapter import SharedBaseScore, reward_adapter_for
from medgpt_ray.stages.rewards import accuracy, format_reward, reward_functions
from medgpt_ray.stages.stage_data import open_stage_data
from medgpt_ray.stages.trainer_args import training_kwargs
from medgpt_ray.trainer_kit.checkpointing import FractionAtEveryForward
from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.generation_rate import GenerationRate
from medgpt_ray.trainer_kit.merged_rollouts import MergedRollouts, merging_behaviour
from medgpt_ray.trainer_kit.prompt_shard import PromptShardLoader
from medgpt_ray.trainer_kit.static_rollouts import StaticRollouts, static_decoding


def prompt_rows(records: list[dict], tokenizer, template, seq_len: int, completion_len: int,
                policy: str = "truncate"):
    """TRL's prompt rows {"prompt": rendered text, "answer": reference or None}. A prompt longer than seq_len less
    `completion_len` keeps its end (TRL's left truncation) or is left out, by `policy`; one with tools the template
    cannot render is left out. Returns (dataset, {"tools_unsupported": n, "too_long": n, "overlong": LengthTally})."""
    from datasets import Dataset

    prompts, kept, lengths, tools_unsupported = rendered_prompts(records, tokenizer, template)
    room, tally = seq_len - completion_len, LengthTally(seq_len, policy, "prompts", "prompts")
    rows: dict[str, list] = {"prompt": [], "answer": []}
    for prompt, r, n in zip(prompts, kept, lengths, strict=True):
        outcome = prompt_outcome(n, room, policy)
        tally.add(n + completion_len, outcome)
        if outcome == "truncated":
            prompt = prompt_end(tokenizer, prompt, room)
        if outcome != "skipped":
            rows["prompt"].append(prompt)
            rows["answer"].append(r.get("answer"))
    if records and not rows["prompt"]:
        raise ValueError(f"none of the {len(records)} prompts can be trained: {tools_unsupported} have tools "
                         f"template {template.name!r} cannot render, {tally.skipped} do not fit seq_len {seq_len}")
    return Dataset.from_dict(rows), {"too_long": tally.skipped, "tools_unsupported": tools_unsupported,
                                     "overlong": tally}


def prompt_end(tokenizer, prompt: str, room: int) -> str:
    """The prompt's last `room` tokens, as text again (TRL tokenizes the prompt itself); a cut through a multi-byte
    character can re-tokenize longer, so the cut moves right until it fits."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    start = len(ids) - room
    while True:
        text = tokenizer.decode(ids[start:])
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= room:
            return text
        start += 1


def online_kwargs(inp: StageInputs) -> dict[str, Any]:
    """The config keywords GRPOConfig and RLOOConfig share, from the plan and the stage's keys; TRL's own evaluation
    is off (the stage scores held-out prompts itself, greedily)."""
    cfg = inp.cfg
    return {**training_kwargs(inp), "eval_strategy": "no", "eval_steps": None,
            "include_num_input_tokens_seen": "no",  # the trainer counts prompt + completion tokens itself
            "num_generations": cfg.num_generations, "max_completion_length": cfg.max_completion_length,
            "temperature": cfg.temperature, "beta": cfg.beta, "reward_weights": cfg.reward_weights,
            "steps_per_generation": inp.plan.steps_per_generation or None, "shuffle_dataset": False,
            # The rollout's own GenerationConfig says KV cache: it wins over the policy's generation_config, whatever
            # a checkpoint's config.json says (models.load_causal_lm; tests/stages/test_rollout_kv_cache.py).
            "generation_kwargs": {"use_cache": True}}


def build_online(inp: StageInputs, trl_class: Any, make_args: Callable[[StageInputs], Any], sink: Sink | None,
                 callbacks: Sequence[TrainerCallback], clip: Sequence[float] | None = None) -> BuiltStage:
    """An online-RL trainer (TRL's GRPOTrainer or RLOOTrainer: the same constructor) on this worker's shard of the
    prompts, with the reward functions the config names (a reward model on the policy's device; each clipped to
    `clip` when given), LoRA or full, the generation counters (trainer_kit/generation_rate.py) and the held-out
    prompts (`held_out`)."""
    cfg = inp.cfg
    data = open_stage_data(inp)
    tok = data.tokenizer
    tok.padding_side = "left"  # generation pads prompts on the left
    train_ds, skipped, eval_ds = data.encoded(prompt_rows, cfg.seq_len, cfg.max_completion_length,
                                              overlong_policy(cfg))
    model = models.load_causal_lm(Path(inp.model_path), inp.plan.precision, inp.plan.method)
    peft_config = models.lora_config(cfg.lora, "CAUSAL_LM", model) if inp.plan.method != "full" else None
    device = "cuda" if inp.plan.use_gpu else "cpu"
    shared = shared_base_scorer(inp)
    rewards = reward_functions(cfg.reward_funcs, length_target=cfg.free_length,
                               max_completion_length=cfg.max_completion_length,
                               reward_model_dir=inp.needs.get(reward_model_kind()), device=device, stage=inp.stage,
                               remote=shared or inp.reward_scorer, clip=clip)
    # FractionAtEveryForward: the rollout re-enables checkpointing on every layer; the plan's fraction is restored.
    merged = merging_behaviour(inp.plan.rollout, MergedRollouts)
    # StaticRollouts (after the merge: it decodes the merged weights): the plan's static decode path, one static
    # cache for the run at the plan's length (prompt room + completions).
    static = static_decoding(inp.plan, cfg)
    trainer = trainer_class(trl_class, GenerationRate, PromptShardLoader, FractionAtEveryForward, *merged,
                            *((StaticRollouts,) if static else ()))(
        model=model, reward_funcs=rewards, args=make_args(inp), train_dataset=train_ds, processing_class=tok,
        peft_config=peft_config, callbacks=stage_callbacks(inp, sink, callbacks), shard=data.shard, **(static or {}))
    if shared is not None:
        shared.attach(trainer.model)  # the reward adapter beside the policy's, before any wrapping or optimizer
    return BuiltStage(trainer, tok, lora=peft_config is not None, eval_size=len(eval_ds) if eval_ds else 0,
                      extras={"train_prompts": len(train_ds), "skipped_tools_unsupported": skipped["tools_unsupported"],
                              "skipped_too_long": skipped["too_long"], "overlong": skipped["overlong"],
                              # Where the reward_model reward was computed: each worker (its own network, or
                              # the rm's adapter on the policy's base), or the actor of its own.
                              **({"reward_model_scored_by": "shared_base" if shared else
                                  "actor" if inp.reward_scorer else "worker"}
                                 if "reward_model" in cfg.reward_funcs else {})},
                      save_kwargs={"template": data.template}, held_out=eval_ds)


def shared_base_scorer(inp: StageInputs) -> SharedBaseScore | None:
    """The reward_model reward on the policy's own base (stages/reward_adapter.py) when the config resolved
    reward_shared_base true (config/online_rl.py: a reward_model reward, no actor, the rm trained with LoRA from this
    stage's `from`); its adapter files checked now (a clear error when rm kept none, or kept one of another base)."""
    rm = reward_model_kind()
    if inp.cfg.reward_shared_base is not True or rm not in inp.needs:
        return None
    return SharedBaseScore(reward_adapter_for(inp.needs[rm], inp.model_path, inp.stage), inp.needs[rm])


def greedy_completions(trainer: Any, prompts: list[str], batch_size: int = 64) -> list[str]:
    """Greedy completions of `prompts` (rendered text) by the trainer's current policy, max_completion_length."""
    import torch

    tok = trainer.processing_class
    out: list[str] = []
    # On the merged adapter where the rollouts merge (MergedRollouts: ~3.5x a decode step's speed, the base restored
    # bit-exact after); eager and dynamic, a batch of its own (the static cache is the rollouts').
    merged = getattr(trainer, "_merged", None)
    with policy_in_eval(trainer) as model, (merged() if merged else contextlib.nullcontext()):
        for i in range(0, len(prompts), batch_size):
            batch = tok(prompts[i:i + batch_size], return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=False).to(trainer.accelerator.device)
            with torch.no_grad():
                ids = model.generate(**batch, max_new_tokens=trainer.max_completion_length, do_sample=False,
                                     pad_token_id=tok.pad_token_id, eos_token_id=trainer.eos_token_ids)
            out += tok.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def held_out_rewards(trainer: Any, prompts: Any) -> dict[str, Any]:
    """Mean accuracy and format rewards of greedy completions of the held-out prompts (a dataset of prompt rows);
    the accuracy over the prompts that have a reference answer. With a reward model among the trainer's rewards,
    also its mean score of those completions (`eval_reward_model`)."""
    # The rm's score, loaded here (RewardModelScore) or served by an actor (reward_model_gpu): TRL's name for it.
    # Unclipped (reward_clip_range clips what trains, not what is reported).
    scorer = next((getattr(f, "__wrapped__", f) for f in trainer.reward_funcs
                   if getattr(f, "__name__", None) == "reward_model"), None)
    if prompts is None or len(prompts) == 0:
        return {"eval_accuracy": None, "eval_format": None, "eval_prompts": 0,
                **({"eval_reward_model": None} if scorer else {})}
    completions = greedy_completions(trainer, list(prompts["prompt"]))
    scored = [a for a in accuracy(completions, answer=prompts["answer"]) if a is not None]
    fmt = format_reward(completions)
    out = {"eval_accuracy": sum(scored) / len(scored) if scored else None, "eval_format": sum(fmt) / len(fmt),
           "eval_prompts": len(completions)}
    if scorer is not None:
        scores = scorer(list(prompts["prompt"]), completions)
        out["eval_reward_model"] = sum(scores) / len(scores)
    return out


def run_online(inp: StageInputs, build_stage: Callable[..., BuiltStage], sink: Sink | None,
               callbacks: Sequence[TrainerCallback]) -> dict[str, Any]:
    """Build (with the kind's `build`) and train an online-RL stage; its `eval` holds the held-out greedy rewards
    after training and, as `<key>_before`, before it (same prompts, greedy decoding)."""
    t0 = time.monotonic()
    built = build_stage(inp, sink, callbacks)
    trainer = built.trainer
    before = held_out_rewards(trainer, built.held_out)
    built.eval_size = 0  # no TRL evaluation: the held-out numbers are the greedy rewards below
    result = finish_stage(inp, built, t0, lambda ev: {})
    after = held_out_rewards(trainer, built.held_out)
    result[HELD_OUT] = {**after, **{f"{k}_before": v for k, v in before.items() if k != "eval_prompts"}}
    write_result(inp, result)
    return result
