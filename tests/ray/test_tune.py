"""Ray Tune sweeps: trials that cannot fit never start, the rest run the real stage, the best is a config."""

from __future__ import annotations

import json

import pytest
import yaml

from medgpt_ray.config import load_config

pytestmark = pytest.mark.ray

BASE = {
    "name": "sweepbase", "model": {"path": "tiny"},
    "data": {"sft": ["data/sample/sft_sharegpt.jsonl"], "max_records": 48, "eval_fraction": 0.2},
    # A simulated 0.27 GiB card: micro-batch 8 without checkpointing is predicted at 0.28 GiB and must be pruned.
    "resources": {"num_workers": 1, "cpus_per_worker": 1, "gpu_memory_gib": 0.27, "memory_margin_gib": 0.0},
    "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
               "sft": {"method": "lora", "lora": {"rank": 8, "dropout": 0.0}, "seq_len": 256, "effective_batch": 8,
                       "max_steps": 2, "grad_ckpt": False, "logging_steps": 1}},
}
SWEEP = {"stage": "sft", "metric": "eval_loss", "mode": "min", "searcher": "grid", "scheduler": "none",
         "space": {"micro_batch": {"grid": [2, 8]}, "lr": {"grid": [1.0e-3, 1.0e-2]}}}


def test_sweep_prunes_what_cannot_fit_and_writes_the_best_override(ray_cluster, repo, tmp_path, monkeypatch):
    # Over 60 s (~80 s on 2 cores), on purpose: a real 4-trial Tune sweep (2 trials each start a Ray Train run)
    # and its restore; pruning, the best override and --resume are only visible across trials. The base config's
    # data is `data.raw`: the sweep cleans it first, as the pipeline does, and its trials are planned and trained on
    # that cleaned split (run/stage_data.py is the pipeline's and the sweep's data). That was a sweep of its own
    # (one Tune experiment and one Ray Train run more, ~30-50 s); what it checked is checked on this one.
    from medgpt_ray.data.shards import num_rows, read_table
    from medgpt_ray.tune.driver import run_sweep

    monkeypatch.chdir(repo)
    cfg_file, sweep_file = tmp_path / "base.yaml", tmp_path / "sweep.yaml"
    # Ray Train's and Tune's storage go where resources.storage_path says (shared storage on a cluster).
    base = {**BASE, "output_dir": str(tmp_path / "runs"),
            "data": {"raw": [str(repo / "data/sample/raw")], "eval_fraction": 0.2},
            "resources": {**BASE["resources"], "storage_path": str(tmp_path / "storage")}}
    cfg_file.write_text(yaml.safe_dump(base))
    sweep_file.write_text(yaml.safe_dump(SWEEP))
    lines: list[str] = []
    summary = run_sweep(str(cfg_file), [], str(sweep_file), echo=lines.append)
    rows = summary["rows"]
    assert len(rows) == 4
    pruned = [r for r in rows if r["status"] == "pruned"]
    done = [r for r in rows if r["status"] == "done"]
    assert sorted(r["params"]["micro_batch"] for r in pruned) == [8, 8]
    assert all(r["predicted_peak_gib"] > 0.27 for r in pruned) and summary["pruned"] == 2
    assert len(done) == 2 and all(r["eval_loss"] is not None and r["eval_loss"] < 1e8 for r in done)
    # Pruned trials never created a Ray Train run (no worker process, no stage directory).
    out = tmp_path / "runs" / "sweepbase-tune-sft"
    storage = tmp_path / "storage" / out.name
    train_runs = sorted(p.name for p in (storage / "train").iterdir())
    assert len(train_runs) == 2 and (storage / "tune" / "sweep").is_dir()
    assert not (out / "train").exists() and not (out / "tune").exists()
    trials = sorted((out / "trials").iterdir())
    assert len(trials) == 2
    # The trials' data is the cleaned raw sources: the planted ID redacted, every record the cleaner emitted split.
    report = json.loads((out / "clean" / "report.json").read_text())
    train, held_out = out / "data" / "sft.train.parquet", out / "data" / "sft.eval.parquet"
    assert num_rows(train) + num_rows(held_out) == report["per_kind"]["sft"]["emitted"] > 0
    sft_text = "\n".join(read_table(train).column("record").to_pylist())
    assert "110105196709131164" not in sft_text and "<ID_CARD>" in sft_text  # cleaned: the planted ID redacted
    for trial in trials:
        plan = json.loads((trial / "sft" / "plan.json").read_text())
        assert plan["lengths"]["records"] == num_rows(train)  # planned at the cleaned split's lengths
        assert json.loads((trial / "sft" / "result.json").read_text())["steps"] == 2
    # The best trial is a ready override file the pipeline accepts.
    best = yaml.safe_load((out / "best_overrides.yaml").read_text())
    assert best["stages.sft.micro_batch"] == 2 and best["stages.sft.lr"] in (1.0e-3, 1.0e-2)
    cfg = load_config(cfg_file, overrides_file=out / "best_overrides.yaml")
    assert cfg.stages.sft.lr == best["stages.sft.lr"]
    assert any(line.startswith("pruned 2 of 4 trial(s) before launch") for line in lines)
    # A line per finished trial while the sweep runs (Tune's own reporter is off): 4 trials, pruned ones said.
    trial_lines = [line for line in lines if line.startswith("[tune] trial ")]
    assert [line.split()[2] for line in trial_lines] == ["1/4", "2/4", "3/4", "4/4"], trial_lines
    assert sum("pruned before launch" in line for line in trial_lines) == 2
    assert sum("eval_loss " in line for line in trial_lines) == 2
    assert json.loads((out / "sweep_results.json").read_text())["pruned"] == 2

    # Interrupted or finished: --resume restores the experiment and reruns nothing that finished.
    again = run_sweep(str(cfg_file), [], str(sweep_file), echo=lines.append, resume=True)
    assert any("resuming the sweep" in line for line in lines)
    assert sorted(p.name for p in (storage / "train").iterdir()) == train_runs
    assert sorted(r["status"] for r in again["rows"]) == sorted(r["status"] for r in rows)


def test_concurrent_trials_get_disjoint_gpu_sets(ray_cluster):
    import ray

    from medgpt_ray.placement.policy import partition_gpus
    from medgpt_ray.placement.topology import load_topology_file
    from medgpt_ray.tune.slots import SlotPool
    from medgpt_ray.tune.sweep import wait_for_slot

    groups, _ = partition_gpus(load_topology_file("8x4090-switches-single-socket"), [2, 2, 2, 2])
    pool = SlotPool.remote(groups)
    slots = [wait_for_slot(pool) for _ in range(4)]
    sets = [ray.get(pool.group.remote(s)) for s in slots]
    assert sorted(g for s in sets for g in s) == list(range(8))  # four trials, disjoint pairs
    assert ray.get(pool.acquire.remote()) is None  # a fifth waits
    pool.release.remote(slots[1])
    assert ray.get(pool.acquire.remote("trial_b")) == slots[1]
    # A trial that Tune (ASHA) stops is killed before its own release: the driver releases by owner.
    ray.get(pool.release_owner.remote("trial_b"))
    assert ray.get(pool.acquire.remote()) == slots[1]
    ray.kill(pool)


def test_a_sweep_from_a_finished_run_trains_from_its_sft(tiny_run, repo, tmp_path, monkeypatch):
    """dpo starts from sft in the pipeline: with --from-run a trial trains from the run's sft model, not the base
    model, and its trial.json says so. One trial of one step (~25 s on 2 cores, most of it Ray Train's and Tune's
    start), after the shared tiny run it reads."""
    from medgpt_ray.tune.driver import run_sweep

    monkeypatch.chdir(repo)
    sft_model = json.loads((tiny_run.run_dir / "manifest.json").read_text())["stages"]["sft"]["output_model"]
    cfg_file, sweep_file = tmp_path / "base.yaml", tmp_path / "sweep.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "name": "sweepdpo", "output_dir": str(tmp_path / "runs"), "model": {"path": "tiny"},
        "data": {"sft": ["data/sample/sft_sharegpt.jsonl"], "preference": ["data/sample/reward.jsonl"],
                 "max_records": 48, "eval_fraction": 0.2},
        "resources": {"num_workers": 1, "cpus_per_worker": 1, "memory_margin_gib": 0.0},
        # sft stays enabled: it is what dpo starts from (run/dag.effective_from), and the run's is taken.
        "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "sft": {"method": "lora"},
                   "dpo": {"method": "full", "seq_len": 256, "effective_batch": 4, "max_steps": 1,
                           "logging_steps": 1}}}))
    sweep_file.write_text(yaml.safe_dump({"stage": "dpo", "metric": "eval_loss", "mode": "min", "searcher": "grid",
                                          "scheduler": "none", "space": {"lr": {"grid": [5.0e-4]}}}))
    lines: list[str] = []
    summary = run_sweep(str(cfg_file), [], str(sweep_file), echo=lines.append, from_run=str(tiny_run.run_dir))
    assert [r["status"] for r in summary["rows"]] == ["done"], summary["rows"]
    assert summary["starts_from"] == sft_model and summary["needs"] == {}
    assert any(line.startswith(f"trials start from {sft_model} (stages.dpo starts from sft)") for line in lines)
    (trial,) = sorted((tmp_path / "runs" / "sweepdpo-tune-dpo" / "trials").iterdir())
    provenance = json.loads((trial / "dpo" / "trial.json").read_text())
    assert provenance == {"starts_from": sft_model, "needs": {}, "params": {"lr": 5.0e-4}}
    assert json.loads((trial / "dpo" / "result.json").read_text())["steps"] == 1
