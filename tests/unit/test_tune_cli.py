"""`medgpt-ray tune --dry-run` plans a sweep's trials as the pipeline would plan its stage (no cluster): with the
config's `--overrides` file, and from `model.shape` where the model directory is not on this machine."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from medgpt_ray.cli import main

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "name": "drybase", "model": {"path": "tiny"},
    "data": {"sft": [str(REPO / "data/sample/sft_sharegpt.jsonl")]},
    "resources": {"num_workers": 1, "cpus_per_worker": 1, "memory_margin_gib": 0.0},
    "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
               "sft": {"method": "lora", "lora": {"rank": 8, "dropout": 0.0}, "seq_len": 256, "effective_batch": 8,
                       "max_steps": 2, "grad_ckpt": False}},
}
SWEEP = {"stage": "sft", "metric": "eval_loss", "mode": "min", "searcher": "grid", "scheduler": "none",
         "space": {"micro_batch": {"grid": [2, 8]}, "lr": {"grid": [1.0e-3, 1.0e-2]}}}


def _pruned(out: str) -> tuple[int, int]:
    m = re.search(r"would prune (\d+) of (\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_the_overrides_file_reaches_the_sweep(tmp_path, capsys):
    cfg, sweep, overrides = tmp_path / "base.yaml", tmp_path / "sweep.yaml", tmp_path / "overrides.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "output_dir": str(tmp_path / "runs")}))
    sweep.write_text(yaml.safe_dump(SWEEP))
    assert main(["tune", "--config", str(cfg), "--sweep", str(sweep), "--dry-run"]) == 0
    assert _pruned(capsys.readouterr().out) == (0, 4)  # the tiny model fits the default 24 GiB card at any batch
    # A simulated 0.27 GiB card from the overrides file: micro-batch 8 without checkpointing no longer fits.
    overrides.write_text(yaml.safe_dump({"resources.gpu_memory_gib": 0.27}))
    assert main(["tune", "--config", str(cfg), "--sweep", str(sweep), "--overrides", str(overrides),
                 "--dry-run"]) == 0
    assert _pruned(capsys.readouterr().out) == (2, 4)


def test_a_dry_run_on_the_shipped_7b_config_plans_from_model_shape(capsys):
    # The command configs/sweeps/sft-lora.yaml gives, on a machine without the 7B weights or the data there.
    assert not Path("/mnt/shared/models/Qwen2.5-7B/config.json").is_file()
    rc = main(["tune", "--config", str(REPO / "configs/qwen2.5-7b-4x4090.yaml"),
               "--sweep", str(REPO / "configs/sweeps/sft-lora.yaml"), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    pruned, trials = _pruned(out.out)
    assert trials == 8 and 1 <= pruned < 8  # some of the 7B trials are over a 24 GiB card, not all


def test_the_sweep_files_own_command_on_the_tiny_config_marks_invalid_trials(capsys):
    """configs/sweeps/sft-lora.yaml's header command on configs/tiny-cpu.yaml: a trial whose micro_batch does not
    divide the per-worker batch is a ConfigError, which a real trial prunes as invalid; the dry run says so too
    instead of aborting (issue 48 item 7)."""
    rc = main(["tune", "--config", str(REPO / "configs/tiny-cpu.yaml"),
               "--sweep", str(REPO / "configs/sweeps/sft-lora.yaml"), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "invalid" in out.out and "does not divide the per-worker batch" in out.out


def test_a_sweep_of_a_stage_that_needs_another_is_refused_at_load(tmp_path, capsys):
    """A trial trains its stage alone: opd's `teacher: sft` would have no sft to read (issue 48 item 7), unless
    --from-run names a finished run to read it from (tests/unit/test_tune_upstream.py)."""
    sweep = tmp_path / "opd.yaml"
    sweep.write_text("stage: opd\nmetric: eval_loss\nmode: min\nscheduler: none\nnum_samples: 2\n"
                     "space:\n  lr: {loguniform: [1.0e-5, 1.0e-3]}\n", encoding="utf-8")
    rc = main(["tune", "--config", str(REPO / "configs/tiny-cpu-opd.yaml"), "--sweep", str(sweep), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the output of stage(s) sft, which no trial runs" in err
    assert "give --from-run RUN" in err
