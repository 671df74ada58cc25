"""Done means for RLOO (issue 18): sft -> rm -> rloo on the toy department task (configs/tiny-cpu-rl.yaml's stages)
raises the mean accuracy reward of greedy completions on >= 64 held-out prompts by >= 0.15 (same prompts, same
seed); the reward the policy is trained on is the rm stage's model, the accuracy reward only measures it.

Not yet (issue 18). With the config's earlier SFT (lr 1e-2 x 40) the held-out accuracy reward goes 0.240 -> 0.208
and the reward model's mean score of the greedy answers -0.598 -> -1.413 on 96 prompts: the SFT model answers 呼吸科 to
every diagnosis, and RLOO moves it to another single department. The reward model is not the obstacle: rm full at lr
1e-3 x 600 steps reaches held-out pair accuracy 1.0 and puts the right department first for 63 of 64 prompts (LoRA
at 5e-3 x 200 stays at 0.33). Tried: rloo full at lr 1e-3 x 40-120 steps, k 4 or 8, beta 0, 0.05 and 0.5,
normalize_advantages on and off, temperature 0.7-1.0, and LoRA at lr 1e-2 x 60.
- Pairs that rejected only wrong departments: the policy hacked the reward model with answers cut before 科 ("神经"
  for "神经科", scored alike): accuracy 0.24 -> 0.0 in 4 settings.
- Misspelt answers rejected too: "心心科" to every prompt (0.0; reward model score -2.14 -> 1.60).
- Other real departments rejected as well (the shipped pairs, data/sample/rl/make_rl.py): no hacking, no learning
  (0.240 -> 0.208). From an SFT at lr 1e-3 x 200 steps (0.406 before): 0.385; on the earlier pairs 0.4375, with
  "内科" answered for 心内科 and 消化科.
- From the SFT that GRPO learns from (lr 3e-3 x 100, 0.417 before): rloo full lr 1e-3 x 150, k 8, beta 0.1: the
  training reward (the reward model's score of the samples) rises 0.17 -> ~2, but held-out greedy accuracy stays
  (0.417 -> 0.406) and the reward model's held-out score falls (2.25 -> 1.96).
101 s in one torch thread on the 2-core box while another training run shared it (sft 4 s, rm 24 s, rloo 70 s;
rloo alone 47 s when idle); in two threads there, 284 s for the same numbers."""

from __future__ import annotations

import os
import time

import pytest

from medgpt_ray.config import load_config
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

CHAIN = {"sft": "sft", "rm": "preference", "rloo": "prompt"}  # stage -> the data kind it trains on


# Opt-in while it does not pass: ~100 s of a 2-core CI run to confirm a known failure (the suite's budget is 20 min).
# MEDGPT_RAY_OPEN_ISSUE_TESTS=1 runs it (a strict xfail: a pass fails, so the marks go the day RLOO learns this).
@pytest.mark.skipif(not os.environ.get("MEDGPT_RAY_OPEN_ISSUE_TESTS"), reason="issue 18, open: RLOO does not learn "
                    "the toy task yet; MEDGPT_RAY_OPEN_ISSUE_TESTS=1 runs this ~100 s strict xfail")
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "issue 18, open: the tiny policy does not learn the diagnosis -> department map from the reward model in budget "
    "(the numbers and what was tried: this module's docstring); strict: a pass fails, this mark goes the day it does"))
@pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py
def test_rloo_on_the_reward_model_raises_the_held_out_accuracy_reward(repo, tiny_model, tmp_path):
    t0 = time.monotonic()
    ev = run_chain(load_config(repo / "configs/tiny-cpu-rl.yaml"), repo, tiny_model, tmp_path)["eval"]
    print(f"held-out accuracy reward {ev['eval_accuracy_before']:.3f} -> {ev['eval_accuracy']:.3f}, reward model "
          f"{ev['eval_reward_model_before']:.3f} -> {ev['eval_reward_model']:.3f} on {ev['eval_prompts']} prompts, "
          f"{time.monotonic() - t0:.0f} s")
    assert ev["eval_prompts"] >= 64
    assert ev["eval_accuracy"] - ev["eval_accuracy_before"] >= 0.15


def run_chain(cfg, repo, tiny_model, out) -> dict:
    """sft -> rm -> rloo in this process, each on its data kind as the config gives it; rloo's result."""
    outputs: dict[str, str] = {}
    result: dict = {}
    for stage, kind in CHAIN.items():
        data = prepare_kind(kind, [str(repo / p) for p in cfg.data.paths(kind)], out / kind, cfg.data.eval_fraction)
        c = cfg.stages.get(stage)
        start = outputs.get("sft", str(tiny_model))  # rm and rloo start from the SFT model
        inp = StageInputs(stage, c, plan_stage(stage, c, 1, False), start, "chatml", data.train_file,
                          data.eval_file, str(out / stage), seed=cfg.seed, needs={n: outputs[n] for n in c.needs})
        result = run_stage(inp)
        outputs[stage] = result["output_model"]
    return result
