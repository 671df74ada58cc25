"""The run report built from files alone (no Ray, no training): missing pieces become notes, a failed stage shows its
error, a sweep beside the run shows its trials; the pipeline's hook warns instead of failing a finished run; the
`report_to` key; the TensorBoard writer read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.config import PipelineConfig
from medgpt_ray.report import STRICT_ENV, build_report, write_run_report
from medgpt_ray.report.rundata import quarantine_reasons, read_run, reason_label


def _write(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")


def fake_run(root: Path) -> Path:
    """A run whose pt finished and whose sft failed, with a sweep of sft beside it."""
    run = root / "demo"
    row = {"steps": 4, "wall_s": 12.5, "train_loss_first": 3.0, "train_loss_last": 1.5, "eval": {"eval_loss": 1.7},
           "output_model": None, "error": None}
    _write(run / "summary.json", {"name": "demo", "run_dir": str(run), "wall_s": 30.0, "stages": {
        "dpo": {"status": "not-run"}, "pt": {**row, "status": "done"}, "kto": {"status": "disabled"},
        "sft": {"status": "failed", "error": "OutOfMemoryError: CUDA out of memory", "wall_s": 3.0}}})
    _write(run / "config.resolved.json", {"name": "demo", "stages": {
        "pt": {"from": None, "needs": []}, "sft": {"from": None, "needs": []}, "dpo": {"from": None, "needs": []},
        "kto": {"enabled": False}}})
    _write(run / "pt" / "plan.json", {
        "method": "full", "micro_batch": 2, "grad_accum": 2, "num_workers": 1, "backoffs": [],
        "prediction": {"peak_gib": 10.0, "budget_gib": 20.0, "gpu": "RTX 4090"},
        "alternatives": [{"method": "full", "micro_batch": 4, "peak_gib": 25.0, "why": "over budget"}],
        "reasons": ["micro_batch: searched [1, 2, 4]"]})
    (run / "pt" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": s, "time_s": 2.0 * s, "loss": 3.0 / s, "learning_rate": 1e-3, "tokens_per_s": 900.0 + s,
         "gpu_peak_gib": 9.0 + s / 10} for s in range(1, 5)] + [{"step": 4, "eval_loss": 1.7}]) + '{"step": 5, "lo')
    _write(root / "demo-tune-sft" / "sweep_results.json", {"rows": [
        {"trial": "a", "status": "done", "params": {"lr": 1e-3, "lora.rank": 8}, "eval_loss": 1.2},
        {"trial": "b", "status": "stopped", "params": {"lr": 3e-3, "lora.rank": 32}, "eval_loss": 1.9},
        {"trial": "c", "status": "pruned", "params": {"lr": 1e-2, "lora.rank": 32}, "eval_loss": None,
         "predicted_peak_gib": 30.0, "reason": "predicted 30.0 GiB > budget 20.0 GiB"}],
        "best": {"trial": "a", "eval_loss": 1.2, "params": {"lr": 1e-3, "lora.rank": 8}}})
    return run


def test_a_run_with_missing_pieces_reads_and_reports(tmp_path):
    run = read_run(fake_run(tmp_path))
    assert [s.name for s in run.stages] == ["pt", "sft", "dpo", "kto"]  # the graph's order, not summary.json's
    pt = run.stages[0]
    assert len(pt.train_records) == 4 and pt.measured_peak_gib == pytest.approx(9.4)  # the cut line is dropped
    assert run.clean is None and run.prepared is None and run.sweeps[0].metric == "eval_loss"
    page = build_report(tmp_path / "demo")
    for sid in ("run", "stage-graph", "data", "cleaning", "sweep", "sweep-demo-tune-sft", "stage-pt", "plan-pt",
                "curves-pt", "speed-pt", "gpu-pt", "eval-pt", "stage-sft", "stage-dpo"):
        assert f'<section id="{sid}">' in page, sid
    assert 'id="stage-kto"' not in page and "disabled in the config: kto" in page
    assert "OutOfMemoryError: CUDA out of memory" in page
    assert "not run: this run&#x27;s config has no data.raw" in page
    assert "predicted 30.0 GiB &gt; budget 20.0 GiB" in page  # why the trial was pruned
    # graph, memory plan, loss/lr, speed, GPU memory, sweep
    assert page.count('<img src="data:image/png;base64,') == 6


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a medgpt-ray run directory"):
        read_run(tmp_path)


def test_the_pipeline_hook_warns_and_keeps_the_run_unless_strict(tmp_path, monkeypatch):
    lines: list[str] = []
    monkeypatch.delenv(STRICT_ENV, raising=False)
    assert write_run_report(tmp_path / "missing", lines.append) is None
    assert lines and lines[0].startswith("warning: the run's report was not written (FileNotFoundError: ")
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(FileNotFoundError):
        write_run_report(tmp_path / "missing", lines.append)
    path = write_run_report(fake_run(tmp_path), lines.append)
    assert path is not None and path.name == "report.html" and lines[-1] == f"report: {path} (open it in a browser)"


def test_quarantine_reasons_are_counted_without_positions(tmp_path):
    q = tmp_path / "quarantine-sft.jsonl"
    q.write_text("".join(json.dumps(r) + "\n" for r in [
        {"file": "f", "line": 3, "reason": "invalid JSON: Expecting value (column 88)", "raw": "SECRET text"},
        {"file": "f", "line": 9, "reason": "invalid JSON: Unterminated string (column 7)", "raw": "more"},
        {"file": "f", "line": 12, "reason": "turn 2: a tool turn must directly follow a tool_call turn"}]))
    assert quarantine_reasons(q) == {"invalid JSON": 2, "a tool turn must directly follow a tool_call turn": 1}
    assert reason_label("missing field 'rejected'") == "missing field 'rejected'"


def test_report_to_is_global_with_a_per_stage_override_and_not_in_the_fingerprint():
    cfg = PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": {"rm": {"report_to": "none"}}})
    assert cfg.report_to == "tensorboard"
    assert cfg.report_to_for("sft") == "tensorboard" and cfg.report_to_for("rm") == "none"
    off = PipelineConfig.model_validate({"model": {"path": "tiny"}, "report_to": "none"})
    assert off.report_to_for("sft") == "none"
    assert "report_to" not in cfg.stages.get("rm").training_identity()
    with pytest.raises(ValueError, match="report_to"):
        PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": {"sft": {"report_to": "wandb"}}})


def test_the_tensorboard_writer_reads_back_and_only_rank_zero_writes(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from medgpt_ray.stages.tensorboard import tensorboard_for

    assert tensorboard_for(tmp_path, "tensorboard", rank_zero=False) is None
    assert tensorboard_for(tmp_path, "none", rank_zero=True) is None
    tb = tensorboard_for(tmp_path, "tensorboard", rank_zero=True)
    for step in (1, 2, 3):
        tb.add("medgpt_train_loss", 1.0 / step, step)
    tb.add("medgpt_train_loss", float("nan"), 4)  # not written
    tb.add_eval({"eval_loss": 0.5, "epoch": 1.0}, 3)
    tb.flush()  # StageMetrics flushes at every log
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("medgpt_train_loss")] == [(1, 1.0), (2, 0.5),
                                                                                       (3, 0.3333)]
    assert [e.value for e in acc.Scalars("medgpt_eval_loss")] == [0.5]


def test_the_plan_shows_the_device_it_ran_on_beside_the_planning_target(tmp_path):
    """A GPU stage planned for the default target (an RTX 4090) that ran on H200s: both named, and a sentence that
    they differ; its reward clipping shown."""
    run = fake_run(tmp_path)
    plan = json.loads((run / "pt" / "plan.json").read_text())
    plan.update(use_gpu=True, reward_clip={"min": -5.0, "max": 5.0, "applied_to": "each reward function's value"})
    plan["prediction"]["gpu"] = "NVIDIA GeForce RTX 4090"
    _write(run / "pt" / "plan.json", plan)
    _write(run / "pt" / "result.json", {"steps": 4, "workers": [
        {"rank": r, "host": "h200-box", "device": f"cuda:{r}", "gpu_name": "NVIDIA H200"} for r in range(2)]})
    page = build_report(run)
    assert "<th>ran on</th><td>2 x NVIDIA H200 (1 host)</td>" in page
    assert "<th>planned for (speed model)</th><td>NVIDIA GeForce RTX 4090</td>" in page
    assert "predicted for NVIDIA GeForce RTX 4090, not the NVIDIA H200 the stage ran on" in page
    assert "<th>budget GiB</th><td>20</td>" in page
    assert "<th>rewards clipped to</th><td>[-5, 5]: each reward function&#x27;s value</td>" in page


def test_a_cpu_stage_says_it_has_no_gpu_budget_and_ran_on_cpu(tmp_path):
    run = fake_run(tmp_path)
    _write(run / "pt" / "plan.json", {"method": "full", "use_gpu": False, "backoffs": [], "prediction": {
        "peak_gib": 1.2, "budget_gib": None, "gpu": "CPU", "budget_source": "80 % of 12.0 GiB host RAM available"}})
    _write(run / "pt" / "result.json", {"workers": [{"rank": 0, "host": "laptop", "device": "cpu"}]})
    page = build_report(run)
    assert "<th>budget GiB</th><td>CPU run: no GPU budget (host RAM instead: see &#x27;budget from&#x27;)</td>" in page
    assert "<th>budget GiB</th><td>–</td>" not in page
    assert "<th>ran on</th><td>1 x CPU (1 host)</td>" in page and "predicted for" not in page
    assert "rewards clipped to" not in page


def test_the_navigation_names_each_link_once_with_an_eval_stage(tmp_path):
    """The evaluation's section and the eval stage's were both linked as "eval" (issue 48 item 10)."""
    run = fake_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary["stages"]["eval"] = {"status": "done", "steps": None, "wall_s": 5.0}
    _write(run / "summary.json", summary)
    config = json.loads((run / "config.resolved.json").read_text())
    config["stages"]["eval"] = {"from": None, "needs": []}
    _write(run / "config.resolved.json", config)
    page = build_report(run)
    links = page[page.index("<nav>"):page.index("</nav>")]
    labels = [seg.split(">", 1)[1] for seg in links.split("</a>")[:-1]]
    assert 'id="stage-eval"' in page and "evaluation" in labels and "eval stage" in labels
    assert len(labels) == len(set(labels))
