"""The eval stage's numbers without a model (issue 19 item 2): the win rate and its bootstrap interval on hand-made
scores, the config of the eval kind (what it compares by default, one worker), and how its results are printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medgpt_ray.config import ConfigError, load_config
from medgpt_ray.kinds.eval.scores import loglik_choice
from medgpt_ray.kinds.eval.stats import bootstrap_interval, outcomes, win_rate
from medgpt_ray.run import dag
from medgpt_ray.run.eval_report import format_eval_lines

REPO = Path(__file__).resolve().parents[2]


def test_wins_ties_and_losses_count_ties_half():
    w = win_rate([3.0, 2.0, 1.0, 0.5], [1.0, 2.0, 3.0, 0.0], resamples=500, seed=1)
    assert (w["wins"], w["ties"], w["losses"], w["prompts"]) == (2, 1, 1, 4)
    assert w["win_rate"] == pytest.approx(2.5 / 4)
    lo, hi = w["ci95"]
    assert 0 <= lo <= w["win_rate"] <= hi <= 1
    assert list(outcomes([1.0, 1.0 + 1e-9, 0.0], [1.0, 1.0, 1.0])) == [0.5, 0.5, 0.0]  # within tolerance: a tie


def test_a_model_against_itself_is_a_tie_everywhere():
    scores = list(np.random.default_rng(0).normal(size=40))
    w = win_rate(scores, scores)
    assert (w["wins"], w["ties"], w["losses"]) == (0, 40, 0)
    assert w["win_rate"] == 0.5 and w["ci95"][0] <= 0.5 <= w["ci95"][1]


def test_one_sided_outcomes_have_a_degenerate_interval():
    assert win_rate([2.0] * 10, [1.0] * 10)["ci95"] == [1.0, 1.0]
    assert win_rate([0.0] * 10, [1.0] * 10)["win_rate"] == 0.0


def test_the_bootstrap_interval_is_seeded_and_about_the_normal_one():
    values = np.array([1.0] * 140 + [0.0] * 60)  # p = 0.7 over 200 prompts: normal 95 % half-width ~0.064
    lo, hi = bootstrap_interval(values, resamples=2000, seed=7)
    assert (lo, hi) == bootstrap_interval(values, resamples=2000, seed=7)
    assert lo < 0.7 < hi
    assert 0.05 < (hi - lo) / 2 < 0.08


def test_scores_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="one score per prompt"):
        win_rate([1.0, 2.0], [1.0])


def test_the_loglik_choice_normalises_by_length_unless_told_not_to():
    scores = {"A": (-6.0, 2), "B": (-4.0, 1), "C": (-9.0, 6)}  # means -3, -4, -1.5; sums -6, -4, -9
    assert loglik_choice(scores) == "C"
    assert loglik_choice(scores, normalised=False) == "B"


def test_the_eval_stage_compares_every_other_enabled_stage_by_default():
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml")
    assert cfg.enabled_stages()[-1] == "eval"
    assert cfg.stages.eval.needs == ["pt", "rm", "dpo"]
    assert dag.effective_from(cfg, "eval") == "sft"
    assert dag.waves(cfg, cfg.enabled_stages())[-1] == ["eval"]
    alignment = load_config(REPO / "configs" / "tiny-cpu-alignment.yaml")
    assert alignment.stages.eval.needs == ["pt", "rm", "dpo", "orpo", "simpo", "kto"]
    no_rm = load_config(REPO / "configs" / "tiny-cpu.yaml", ["stages.rm.enabled=false"])
    assert no_rm.stages.eval.needs == ["pt", "dpo"]  # no judge: losses and the exam only
    given = load_config(REPO / "configs" / "tiny-cpu.yaml", ["stages.eval.needs=[rm, dpo]"])
    assert given.stages.eval.needs == ["rm", "dpo"]


def test_the_eval_stage_is_off_by_default_and_runs_in_one_worker():
    from medgpt_ray.config import PipelineConfig

    assert "eval" not in PipelineConfig.model_validate({"model": {"path": "tiny"}}).enabled_stages()
    with pytest.raises(ConfigError, match="stages.eval.num_workers"):
        load_config(REPO / "configs" / "tiny-cpu.yaml", ["stages.eval.num_workers=2"])


def test_the_eval_fingerprint_follows_the_exam_and_prompt_data():
    from medgpt_ray.config import stage_kind

    fps = {"sft": "s", "prompt": "p", "exam": "e", "pretrain": "t"}
    base = dag.stage_data_fingerprint(stage_kind("eval"), fps)
    assert base != dag.stage_data_fingerprint(stage_kind("eval"), {**fps, "exam": "e2"})
    assert dag.stage_data_fingerprint(stage_kind("sft"), {**fps, "exam": "e2"}) == "s"


STATIC = "static (auto: static cache, the decode step compiled by transformers with CUDA graphs)"


def test_the_eval_section_of_the_summary():
    ev = {"reference": "sft", "judge": "rm",
          "data": {"heldout_conversations": 12, "prompts": 16, "exam_questions": 52},
          "models": {"sft": {"heldout": {"loss": 2.5, "perplexity": 12.18}, "decode_path": STATIC,
                             "answers": {"mean_reward": 0.1, "mean_new_tokens": 20.5},
                             "exam": {"loglik_accuracy": 0.3, "loglik_sum_accuracy": 0.3,
                                      "generated_accuracy": 0.25}},
                     "dpo": {"heldout": {"loss": 2.6, "perplexity": 13.46}, "decode_path": STATIC,
                             "answers": {"mean_reward": 0.4, "mean_new_tokens": 18.0},
                             "exam": {"loglik_accuracy": 0.31, "loglik_sum_accuracy": 0.29,
                                      "generated_accuracy": 0.2}}},
          "win_rates": {"dpo": {"prompts": 16, "wins": 10, "ties": 2, "losses": 4, "win_rate": 0.6875,
                                "ci95": [0.47, 0.88]}}}
    from medgpt_ray.report.eval_section import eval_section

    html = eval_section(ev)
    assert 'id="eval"' in html and "win rate over sft" in html and "0.6875" in html and "data:image/png" in html
    assert 'alt="win rates: each model&#x27;s win rate as a point, its bootstrap 95% CI as an error bar"' in html
    assert "not run: no eval stage" in eval_section(None)
    assert html.count("decode path of") == 1 and f"decode path of sft, dpo: {STATIC}" in html
    ev["models"]["dpo"]["decode_path"] = "dynamic (generation_path: dynamic)"
    lines = format_eval_lines({"eval": ev})
    assert f"decode path of sft: {STATIC}" in lines
    assert "decode path of dpo: dynamic (generation_path: dynamic)" in lines
    assert lines[0].startswith("eval (held-out: 12 conversations, 16 prompts, 52 exam questions; judge: rm)")
    assert any(line.startswith("dpo") and "2.600" in line and "0.400" in line for line in lines)
    assert lines[-1] == ("win rate dpo over sft: 0.688 [0.470, 0.880] 95% CI (10 wins, 2 ties, 4 losses of 16)")
    assert any("exam ll: exam accuracy by the options' log-likelihood" in line for line in lines)  # the columns said
    assert format_eval_lines({}) == []


def test_win_rates_are_drawn_as_points_with_ci_error_bars_not_bars():
    """Each model's win rate a point, its CI an error bar from the low to the high bound; no bar for a bound."""
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer, ErrorbarContainer

    from medgpt_ray.report.plots import win_rate_figure

    fig = win_rate_figure("win rate over sft", ["dpo", "grpo"], [0.6875, 0.4], [(0.47, 0.88), (0.2, 0.55)])
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    (err,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert not bars
    line, _, (vertical,) = err.lines
    assert list(line.get_ydata()) == [0.6875, 0.4]
    spans = [tuple(round(float(y), 4) for y in seg[:, 1]) for seg in vertical.get_segments()]
    assert spans == [(0.47, 0.88), (0.2, 0.55)]
    plt.close(fig)


def test_the_model_card_renders_the_eval_results_as_a_table():
    """`export`'s card (run/export.py): the eval stage's numbers for the exported model as a Markdown table, the
    win rate with its CI and counts in a row; no JSON dump."""
    from medgpt_ray.run.export import _card_markdown

    info = {"run": "demo", "stage": "dpo", "dtype": "bf16", "base_model": "/m", "git_commit": "abc",
            "template": "chatml", "lineage": ["sft", "dpo"], "stages": [], "eval_stage": {
                "reference": "sft", "heldout": {"loss": 2.6, "perplexity": 13.46},
                "answers": {"prompts": 16, "mean_new_tokens": 18.0, "mean_reward": 0.4},
                "exam": {"questions": 52, "loglik_accuracy": 0.31, "loglik_sum_accuracy": 0.29,
                         "generated_accuracy": None},
                "win_rate": {"prompts": 16, "wins": 10, "ties": 2, "losses": 4, "win_rate": 0.6875,
                             "ci95": [0.47, 0.88]}}}
    card = _card_markdown(info)
    assert "## Eval stage (against `sft`)\n\n| measure | value |\n|---|---|\n| held-out loss (responses) | 2.600 |" \
           in card
    for row in ("| held-out perplexity | 13.460 |", "| mean reward of its answers (judge: the rm) | 0.400 |",
                "| exam accuracy: log-likelihood (per token) | 0.310 |",
                "| win rate over sft | 0.688 (95% CI 0.470 - 0.880; 10 wins, 2 ties, 4 losses of 16 prompts) |"):
        assert row in card, row
    assert "generated letter" not in card  # a number the eval stage did not measure: no row
    assert "{" not in card and "Eval stage:" not in card  # no raw JSON
