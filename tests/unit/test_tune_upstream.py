"""`medgpt-ray tune --from-run RUN`: a swept stage starts from, and reads what it `needs` from, a finished pipeline
run (tune/upstream.py), checked in a dry run as in a real one. The run here is its manifest.json written with the
pipeline's own Manifest and a model directory that exists: what the sweep reads of a run (a real one is
tests/ray/test_tune.py's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from medgpt_ray.cli import main
from medgpt_ray.run.manifest import Manifest
from medgpt_ray.tune.driver import run_sweep

REPO = Path(__file__).resolve().parents[2]
OPD_SWEEP = ("stage: opd\nmetric: eval_loss\nmode: min\nscheduler: none\nnum_samples: 2\n"
             "space:\n  lr: {loguniform: [1.0e-5, 1.0e-3]}\n")
DPO_SWEEP = "stage: dpo\nscheduler: none\nsearcher: grid\nspace:\n  lr: {grid: [5.0e-4, 1.0e-3]}\n"


def finished_run(root: Path, *stages: str) -> Path:
    """A run directory whose manifest records `stages` finished, each with its model/ there."""
    run = root / "runs" / "finished"
    manifest = Manifest(run / "manifest.json")
    for stage in stages:
        (run / stage / "model").mkdir(parents=True)
        manifest.record(stage, {"fingerprint": f"{stage}-fp", "output_model": str(run / stage / "model")})
    manifest.save()  # a run that finished nothing still has its manifest
    return run


def sweep_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def tune(config: str, sweep: Path, *extra: str) -> int:
    return main(["tune", "--config", str(REPO / config), "--sweep", str(sweep), "--dry-run", *extra])


def test_an_opd_sweep_reads_its_teacher_from_the_run(tmp_path, capsys):
    """Refused at load without a run (test_tune_cli.py); with one, its sft is the trials' teacher."""
    run = finished_run(tmp_path, "sft")
    teacher = (run / "sft" / "model").resolve()
    rc = tune("configs/tiny-cpu-opd.yaml", sweep_file(tmp_path, OPD_SWEEP), "--from-run", str(run))
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"needs: sft -> {teacher}" in out.out
    assert "trials start from model.path tiny (stages.opd starts from the base model)" in out.out  # the student
    assert "would prune 0 of 2" in out.out


@pytest.mark.parametrize("finished, why", [((), "has no entry for it"), (("sft",), "model directory")])
def test_a_stage_the_run_has_not_finished_is_named(tmp_path, capsys, finished, why):
    run = finished_run(tmp_path, *finished)
    shutil.rmtree(run / "sft", ignore_errors=True)  # finished once, its model since removed
    rc = tune("configs/tiny-cpu-opd.yaml", sweep_file(tmp_path, OPD_SWEEP), "--from-run", str(run))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"--from-run {run}: stages.opd needs the output of stage sft, which that run has not finished" in err
    assert why in err


def test_a_run_without_a_manifest_is_named_by_its_path(tmp_path, capsys):
    run = tmp_path / "runs" / "never-ran"
    rc = tune("configs/tiny-cpu-alignment.yaml", sweep_file(tmp_path, DPO_SWEEP), "--from-run", str(run))
    err = capsys.readouterr().err
    assert rc == 2 and f"{run / 'manifest.json'} not found" in err and "Traceback" not in err


def test_a_dpo_sweep_without_a_run_says_it_starts_from_model_path(tmp_path, capsys):
    """dpo starts from sft in the pipeline; a sweep without a run trains it from the base model, and says so."""
    assert tune("configs/tiny-cpu-alignment.yaml", sweep_file(tmp_path, DPO_SWEEP)) == 0
    out = capsys.readouterr().out
    assert ("trials start from model.path tiny (stages.dpo starts from sft in the pipeline): --from-run RUN would "
            "start them from a finished run's sft") in out


def test_a_dpo_sweep_from_a_run_starts_from_its_sft(tmp_path, repo, monkeypatch):
    monkeypatch.chdir(repo)
    run = finished_run(tmp_path, "sft", "rm")
    sft = (run / "sft" / "model").resolve()
    lines: list[str] = []
    summary = run_sweep(str(repo / "configs/tiny-cpu-alignment.yaml"), [], str(sweep_file(tmp_path, DPO_SWEEP)),
                        echo=lines.append, dry_run=True, from_run=str(run))
    assert summary["starts_from"] == str(sft) and summary["needs"] == {}
    assert f"trials start from {sft} (stages.dpo starts from sft); read from --from-run {run}" \
        in lines
    assert len(summary["rows"]) == 2


def test_a_real_sweep_checks_the_run_before_ray_starts(tmp_path, repo, monkeypatch, capsys):
    """Without --dry-run too, a stage the run has not finished is said before a cluster is started for nothing."""
    import ray

    monkeypatch.chdir(repo)
    run = finished_run(tmp_path)
    rc = main(["tune", "--config", str(REPO / "configs/tiny-cpu-opd.yaml"), "--sweep",
               str(sweep_file(tmp_path, OPD_SWEEP)), "--from-run", str(run)])
    assert rc == 2 and "stages.opd needs the output of stage sft" in capsys.readouterr().err
    assert not ray.is_initialized()
