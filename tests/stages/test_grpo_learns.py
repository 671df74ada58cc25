"""Done means for GRPO (issue 18): sft -> grpo on the toy department task (configs/tiny-cpu-rl.yaml's stages) raises
the mean accuracy reward of greedy completions on >= 64 held-out prompts by >= 0.15 (same prompts, same seed)."""

from __future__ import annotations

import time

import pytest

from medgpt_ray.config import load_config
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs


@pytest.mark.xfail(strict=True, reason=(
    "issue 18, open: after the hard preference pairs changed the sample (and with it the tiny preset's tokenizer), "
    "SFT already answers a department at chance (0.240) and GRPO does not raise it: 0.240 -> 0.000 at lr 5e-3 x 40 "
    "steps, 0.208 at 1e-3 and 2e-3, 0.198 at 2e-3 x 120, 0.240 at 1e-3 x 120 with temperature 1.2. It passed before "
    "(0.000 -> 0.198), where the rise was the answer's form more than the task. Found since: the tiny model does not "
    "learn this task even supervised at the SFT's lr 1e-2 (SFT on the RL train prompts' own answers, 100 steps: "
    "held-out 0.240, the answer token's loss stuck at ln 4), while lr 1e-3 x 200 steps reaches 0.677; SFT at 1e-3 x "
    "100 steps does not teach the answer's form; GRPO at lr 1e-3 x 80 steps from the lr-1e-2 SFT, temperature 1.0 or "
    "1.3: sampled accuracy flat at ~0.25 with rewards spread in 83-93 % of groups, held-out 0.240 -> 0.208 / 0.198. "
    "The toy task or its settings need work; strict: a pass fails, so this mark goes the day GRPO learns it"))
def test_grpo_raises_the_held_out_accuracy_reward(repo, tiny_model, tmp_path):
    cfg = load_config(repo / "configs/tiny-cpu-rl.yaml")
    t0 = time.monotonic()
    data = {kind: prepare_kind(kind, [str(repo / p) for p in cfg.data.paths(kind)], tmp_path / kind,
                               cfg.data.eval_fraction) for kind in ("sft", "prompt")}
    model = str(tiny_model)
    for stage, kind in (("sft", "sft"), ("grpo", "prompt")):
        c = cfg.stages.get(stage)
        inp = StageInputs(stage, c, plan_stage(stage, c, 1, False), model, "chatml", data[kind].train_file,
                          data[kind].eval_file, str(tmp_path / stage), seed=cfg.seed)
        result = run_stage(inp)
        model = result["output_model"]
    ev = result["eval"]
    print(f"held-out accuracy reward {ev['eval_accuracy_before']:.3f} -> {ev['eval_accuracy']:.3f} on "
          f"{ev['eval_prompts']} prompts, {time.monotonic() - t0:.0f} s")
    assert ev["eval_prompts"] >= 64
    assert ev["eval_accuracy"] - ev["eval_accuracy_before"] >= 0.15
