"""A run's held-out preference accuracies beside the model-free baselines (run/pair_report.py): which stages are
judged, what summary.json holds, the summary table's line."""

from __future__ import annotations

import json

from medgpt_ray.config import STAGE_KINDS, load_config, stage_kind
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.run.pair_report import pair_stages, run_baselines, summary_fields
from medgpt_ray.run.progress import format_summary, summary_entry
from tests.unit.test_readers import ROOT

EASY = ROOT / "tests" / "data" / "easy_reward_pairs.jsonl"


def test_every_kind_that_trains_on_pairs_says_how_it_is_judged() -> None:
    """A new preference kind (kto, ...) plugs into the report by its registry entry: where its accuracy is."""
    for kind in STAGE_KINDS.values():
        # unpaired: kto's examples include data.preference's pairs, and it is judged on its held-out ones
        assert (kind.data_kind in ("preference", "unpaired")) == (kind.pair_accuracy is not None), kind.name
    assert stage_kind("rm").pair_accuracy.key == "eval_accuracy"
    assert {stage_kind(s).pair_accuracy.key for s in ("dpo", "orpo", "simpo")} == {"eval_reward_accuracy"}


def test_the_summary_sets_each_stage_beside_the_baselines(tmp_path) -> None:
    cfg = load_config(ROOT / "configs" / "tiny-cpu-alignment.yaml")
    assert pair_stages(cfg) == ["rm", "dpo", "orpo", "simpo", "kto"]
    assert pair_stages(load_config(ROOT / "configs" / "tiny-cpu.yaml")) == ["rm", "dpo"]
    d = prepare_kind("preference", [str(EASY)], tmp_path / "data", 0.15)
    base = run_baselines(cfg, tmp_path / "data", {"preference": d})
    # Every stage skipped: the splits an earlier run left; nothing to judge without them or without a pair stage.
    assert run_baselines(cfg, tmp_path / "data", {}) == base
    assert run_baselines(cfg, tmp_path / "none", {}) is None
    cfg = load_config(ROOT / "configs" / "tiny-cpu-alignment.yaml",
                      [f"stages.{s}.enabled=false" for s in pair_stages(cfg)])
    assert run_baselines(cfg, tmp_path / "data", {"preference": d}) is None

    cfg = load_config(ROOT / "configs" / "tiny-cpu-alignment.yaml")
    done = {"steps": 9, "train_loss_first": 0.7, "train_loss_last": 0.3}
    stages = {"pt": summary_entry("done", {**done, "eval": {"eval_loss": 2.0}}, 1.0, None),
              "rm": summary_entry("done", {**done, "eval": {"eval_accuracy": 0.9, "eval_pairs": 40}}, 1.0, None),
              "dpo": summary_entry("done", {**done, "eval": {"eval_reward_accuracy": 0.8}}, 1.0, None),
              "orpo": summary_entry("failed", {}, 1.0, "boom"), "simpo": summary_entry("pending", {}, None, None)}
    fields = summary_fields(cfg, stages, base)
    length, bigram = base["length"]["accuracy"], base["bigram_perceptron"]["accuracy"]
    assert fields["baselines"] == {"length": length, "bigram_perceptron": bigram}
    assert fields["baselines_detail"]["eval_pairs"] == d.eval_records
    acc = fields["preference_accuracy"]
    assert list(acc) == ["rm", "dpo"]  # stages with no accuracy yet are left out
    assert acc["rm"] == {"accuracy": 0.9, "scored_by": "reward model score",
                         "over_baselines": 0.9 - max(length, bigram)}
    assert json.loads(json.dumps(fields)) == fields
    assert summary_fields(cfg, stages, None) == {}

    summary = {"name": "r", "run_dir": "/tmp/r", "wall_s": 9.0, "stages": stages, **fields}
    line = [x for x in format_summary(summary).splitlines() if x.startswith("held-out preference accuracy")]
    assert line == [f"held-out preference accuracy on {d.eval_records} pairs: rm 0.900 (reward model score), "
                    f"dpo 0.800 (implicit reward beta*log(pi/pi_ref)); baselines without a model: "
                    f"length {length:.3f}, bigram perceptron {bigram:.3f}"]
    assert "held-out preference" not in format_summary({**summary, "baselines": None})
