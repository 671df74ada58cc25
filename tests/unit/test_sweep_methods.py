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


def test_a_kto_sweep_searches_beta_the_weights_and_the_loss(repo, tmp_path):
    cfg = load_config(repo / ALIGNMENT)
    sweep = load_sweep(sweep_file(tmp_path, "stage: kto\nmetric: eval_reward_accuracy\nmode: max\nscheduler: none\n"
                                            "space:\n  beta: {loguniform: [0.02, 0.5]}\n"
                                            "  desirable_weight: {uniform: [0.8, 1.5]}\n"
                                            "  loss_type: {choice: [kto, apo_zero_unpaired]}\n"), cfg)
    assert sweep.stage == "kto" and set(sweep.space) == {"beta", "desirable_weight", "loss_type"}
    base = resolved_dict(cfg)
    trial = trial_config(base, "kto", {"beta": 0.3, "desirable_weight": 1.33, "loss_type": "apo_zero_unpaired"})
    assert (trial.stages.kto.beta, trial.stages.kto.desirable_weight, trial.stages.kto.loss_type) == \
        (0.3, 1.33, "apo_zero_unpaired")
    plan = plan_stage("kto", trial.stages.kto, trial.workers_for("kto"), False)
    assert plan.examples_per_step == trial.stages.kto.effective_batch and plan.micro_batch >= 1
    with pytest.raises(ConfigError, match=r"micro_batch: 1 is below 2"):
        trial_config(base, "kto", {"loss_type": "kto", "micro_batch": 1})


def test_evaluations_report_the_pair_accuracy_under_the_name_a_sweep_asks_for():
    """A real ORPO sweep on eval_reward_accuracy failed at its first evaluation: TRL logs rewards/accuracies, the
    stage result and the summary say eval_reward_accuracy, and Tune requires the metric in every report."""
    from medgpt_ray.run.stage_runner import eval_report_values

    trl = {"eval_loss": 6.19, "eval_rewards/accuracies": 0.47, "eval_rewards/margins": -0.002, "epoch": 0.38,
           "note": "not a number"}
    values = eval_report_values(trl, 30)
    assert values["eval_reward_accuracy"] == 0.47 and values["eval_reward_margin"] == -0.002
    assert values["eval_rewards/accuracies"] == 0.47 and values["step"] == 30 and "note" not in values
    assert "eval_reward_accuracy" not in eval_report_values({"eval_loss": 1.0}, 1)  # sft: nothing invented
