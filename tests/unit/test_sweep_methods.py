"""Tune sweeps reach the preference methods' own keys (issue 17 item 4): a sweep file over `stages.simpo.*` or
`stages.dpo.loss_type` loads against the alignment config, and each trial's config is the base one with those
keys set and checked like any config (a loss parameter where it does not apply is a trial config error)."""

from __future__ import annotations

import pytest

from medgpt_ray.config import ConfigError, load_config, resolved_dict
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.tune.sweep import load_sweep, trial_config

ALIGNMENT = "configs/tiny-cpu-alignment.yaml"


def sweep_file(tmp_path, text: str):
    p = tmp_path / "sweep.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_a_simpo_sweep_sets_its_own_keys_in_every_trial(repo, tmp_path):
    cfg = load_config(repo / ALIGNMENT)
    sweep = load_sweep(sweep_file(tmp_path, "stage: simpo\nmetric: eval_reward_accuracy\nmode: max\n"
                                            "scheduler: none\nspace:\n  gamma: {uniform: [0.2, 1.5]}\n"
                                            "  beta: {choice: [2.0, 2.5]}\n"), cfg)
    assert sweep.stage == "simpo" and set(sweep.space) == {"gamma", "beta"}
    trial = trial_config(resolved_dict(cfg), "simpo", {"gamma": 1.2, "beta": 2.5})
    assert (trial.stages.simpo.gamma, trial.stages.simpo.beta) == (1.2, 2.5)
    assert trial.stages.simpo.enabled and trial.stages.dpo.beta == cfg.stages.dpo.beta
    plan = plan_stage("simpo", trial.stages.simpo, trial.workers_for("simpo"), False)
    assert plan.examples_per_step == trial.stages.simpo.effective_batch


def test_a_dpo_loss_sweep_checks_each_trials_loss_parameters(repo, tmp_path):
    cfg = load_config(repo / ALIGNMENT)
    load_sweep(sweep_file(tmp_path, "stage: dpo\nscheduler: none\nspace:\n"
                                    "  loss_type: {choice: [sigmoid, ipo, robust]}\n"), cfg)
    base = resolved_dict(cfg)
    assert trial_config(base, "dpo", {"loss_type": "ipo"}).stages.dpo.losses == ["ipo"]
    assert trial_config(base, "dpo", {"loss_type": "robust", "label_smoothing": 0.1}).stages.dpo.label_smoothing == 0.1
    with pytest.raises(ConfigError, match=r"label_smoothing: 0.1 applies only to the robust"):
        trial_config(base, "dpo", {"loss_type": "ipo", "label_smoothing": 0.1})
