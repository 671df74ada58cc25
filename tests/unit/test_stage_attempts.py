"""Which failures restart a stage (no cluster): a training worker's process that died, in the shape Ray Train V2's
controller reports it (the e2e resume test in tests/e2e/test_pipeline.py kills a real one), up to
`resources.worker_restarts` times; never an exception the training code raised, nor the controller's own failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ray.exceptions import RayActorError
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from medgpt_ray.config import StageConfig
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.run import backoff
from medgpt_ray.run.backoff import run_with_backoff, worker_death
from medgpt_ray.stages.inputs import StageInputs

# The text of the actor error a SIGKILLed worker leaves (ActorDiedError, abridged).
DIED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n\tpid: 4321\n"
        "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT")


def died(rank: int = 1) -> WorkerGroupError:
    failure = WorkerHealthCheckFailedError("A worker health check failed.", RayActorError("ab12", DIED))
    return WorkerGroupError("worker died", {0: ValueError("collateral: the collective lost its peer"),
                                            rank: failure} if rank else {0: failure})


def test_a_dead_worker_process_is_told_from_an_exception_in_the_training_code():
    assert worker_death(died(1)) == "rank 1, pid 4321"
    assert worker_death(died(0)) == "rank 0, pid 4321"
    assert worker_death(WorkerGroupError("bug", {0: ValueError("a bug fails again")})) is None
    init_failed = RayActorError("ab12", "the worker's constructor raised", actor_init_failed=True)
    assert worker_death(WorkerGroupError("init", {0: init_failed})) is None
    assert worker_death(ControllerError(RayActorError("cd34", DIED))) is None  # the controller, not a worker


@pytest.fixture
def inputs(tmp_path) -> StageInputs:
    cfg = StageConfig(method="lora", max_steps=4, seq_len=64, effective_batch=2)
    return StageInputs("sft", cfg, plan_stage("sft", cfg, 1, False), "model", "chatml", "t", "e", str(tmp_path))


def attempts_failing_with(*errors: Exception) -> tuple[list[int], object]:
    """An attempt function that raises `errors` one per attempt, then succeeds; and the attempts it saw."""
    seen: list[int] = []

    def attempt(n: int, inp: StageInputs) -> None:
        seen.append(n)
        if n < len(errors):
            raise errors[n]

    return seen, attempt


def test_dead_workers_restart_the_stage_up_to_the_limit(inputs, monkeypatch):
    counted: list[tuple[str, dict]] = []
    monkeypatch.setattr(backoff.metrics(), "inc", lambda name, v, tags: counted.append((name, tags)))
    lines: list[str] = []
    seen, attempt = attempts_failing_with(died(), died())
    assert run_with_backoff(inputs, attempt, "r", True, lines.append, worker_restarts=2) is inputs
    assert seen == [0, 1, 2]
    assert lines == [f"[sft] worker died (rank 1, pid 4321): restarting from the start (restart {k} of 2)"
                     for k in (1, 2)]
    assert counted == [("medgpt_pipeline_stage_restarts", {"run": "r", "stage": "sft"})] * 2

    seen, attempt = attempts_failing_with(died(), died())
    with pytest.raises(WorkerGroupError):  # one restart allowed, the second death fails the stage
        run_with_backoff(inputs, attempt, "r", True, lines.append, worker_restarts=1)
    assert seen == [0, 1]


@pytest.mark.parametrize("failure", [KeyError("loss"), torch.OutOfMemoryError("CUDA out of memory")],
                         ids=["bug", "cuda-oom-with-backoff-off"])
def test_an_exception_in_the_training_code_is_not_retried(inputs, failure):
    lines: list[str] = []
    seen, attempt = attempts_failing_with(WorkerGroupError("failed", {0: failure}))
    with pytest.raises(WorkerGroupError):
        run_with_backoff(inputs, attempt, "r", False, lines.append, worker_restarts=2)
    assert seen == [0] and lines == []


def test_oom_at_micro_batch_one_with_full_checkpointing_gives_up_clearly(tmp_path):
    # The back-off itself, through Ray's wrapping of a real worker's OOM, is tests/ray/test_memory_plan.py's.
    cfg = StageConfig(method="lora", max_steps=4, seq_len=64, effective_batch=2, micro_batch=1, grad_ckpt=True)
    inp = StageInputs("sft", cfg, plan_stage("sft", cfg, 1, False), "model", "chatml", "t", "e", str(tmp_path))
    assert (inp.plan.micro_batch, inp.plan.ckpt_fraction) == (1, 1.0)
    oom = WorkerGroupError("failed", {0: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")})
    seen, attempt = attempts_failing_with(oom, oom)
    with pytest.raises(backoff.OutOfMemoryGiveUp, match="out of GPU memory at micro-batch 1 with full "
                                                        "checkpointing.*shorten stages.sft.seq_len") as err:
        run_with_backoff(inp, attempt, "r", True, lambda _: None, worker_restarts=2)
    assert seen == [0] and err.value.__cause__ is oom


def sft_job(tmp_path):
    """An sft StageJob of a config planned at micro-batch 4 x accum 2 (no cluster), its plan and a PreparedData."""
    from medgpt_ray.config import PipelineConfig
    from medgpt_ray.data.prepare import PreparedData
    from medgpt_ray.run.job import StageJob

    cfg = PipelineConfig.model_validate({
        "model": {"path": "tiny"}, "output_dir": str(tmp_path), "resources": {"num_workers": 1},
        "stages": {"sft": {"method": "lora", "max_steps": 4, "seq_len": 64, "effective_batch": 8, "micro_batch": 4,
                           "grad_ckpt": False}}})
    job = StageJob(cfg, "sft", tmp_path / "sft", lambda _: None)
    return job, job.plan(None), PreparedData("sft", "t", "e", 0, 0, 0, 0, None)


def test_an_interrupted_attempt_resumes_at_its_backoffs_from_their_record_not_from_plan_json(tmp_path):
    job, planned, data = sft_job(tmp_path)
    assert (planned.micro_batch, planned.grad_accum) == (4, 2)
    assert job.enter(planned, "fp", fresh=False) == planned  # a new attempt runs the plan as made
    oom = WorkerGroupError("failed", {0: torch.OutOfMemoryError("CUDA out of memory")})
    seen, attempt = attempts_failing_with(oom)
    ran = job.run(job.inputs(planned, "model", data), attempt)
    assert seen == [0, 1] and (ran.micro_batch, ran.grad_accum) == (2, 4)
    assert json.loads((tmp_path / "sft" / "plan.json").read_text())["backoffs"] == ran.backoffs  # StageJob wrote it
    assert json.loads((tmp_path / "sft" / "backoffs.json").read_text())["backoffs"] == ran.backoffs
    # The attempt is cut (Ctrl-C, a lost driver); the same fingerprint resumes at micro-batch 2 from backoffs.json
    # alone: plan.json is the plan's report, never read back.
    (tmp_path / "sft" / "plan.json").unlink()
    resumed = job.enter(planned, "fp", fresh=False)
    assert (resumed.micro_batch, resumed.grad_accum, resumed.backoffs) == (2, 4, ran.backoffs)
    # Another fingerprint (or a forced rerun) starts over, at the plan as made, in an emptied directory.
    assert job.enter(planned, "fp", fresh=True) == planned
    assert not (tmp_path / "sft" / "backoffs.json").exists()
    job.run(job.inputs(planned, "model", data), attempts_failing_with(oom)[1])
    assert job.enter(planned, "other", fresh=False) == planned


def test_a_resumed_attempt_says_which_checkpoint_it_resumes_from(inputs):
    """The workers' own output stays in Ray's session logs: the driver says `resumed from checkpoint-N` (issue 36)."""
    lines: list[str] = []
    run_with_backoff(inputs, lambda n, inp: None, "r", True, lines.append)
    assert not [line for line in lines if "resumed from" in line]  # a fresh stage says nothing of the kind
    for step in (2, 4):
        ckpt = inputs.checkpoint_dir / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    run_with_backoff(inputs, lambda n, inp: None, "r", True, lines.append)
    assert [line for line in lines if "resumed from" in line] == [
        "[sft] resumed from checkpoint-4 (the interrupted attempt's newest checkpoint)"]


def test_the_plan_a_worker_lays_out_is_written_backed_off_and_recorded(tmp_path):
    """A worker that trains otherwise than planned (a packed plan its model cannot pack: stages/packing.py) sends
    that plan through the progress channel, and the job (plan.json's one writer) writes it at once; an OOM then
    backs off from it, not from the plan the driver made; the stage's recorded plan is what trained."""
    from dataclasses import replace

    job, planned, data = sft_job(tmp_path)
    laid_out = replace(planned, micro_batch=2, grad_accum=4, reasons=[*planned.reasons, "laid out by the worker"])
    plan_json = tmp_path / "sft" / "plan.json"
    written: list[dict] = []

    def trains_as_laid_out(n: int, inp: StageInputs) -> None:
        if n == 0:
            job.take_worker_plan(laid_out.to_dict())  # what run/wave.py's progress poll hands the job
            written.append(json.loads(plan_json.read_text()))
            raise WorkerGroupError("failed", {0: torch.OutOfMemoryError("CUDA out of memory")})
        written.append(json.loads(plan_json.read_text()))

    ran = job.run(job.inputs(planned, "model", data), trains_as_laid_out)
    assert (written[0]["micro_batch"], written[0]["grad_accum"]) == (2, 4)
    assert "laid out by the worker" in written[0]["reasons"]
    assert (ran.micro_batch, ran.grad_accum) == (1, 8) and ran.backoffs[0]["before"]["micro_batch"] == 2
    assert written[1]["micro_batch"] == 1

    final = job.run(job.inputs(planned, "model", data), lambda n, inp: job.take_worker_plan(laid_out.to_dict()))
    assert final == laid_out and json.loads(plan_json.read_text())["micro_batch"] == 2  # no back-off: it stands


def test_a_stage_that_cannot_write_is_told_from_other_failures():
    """A worker whose stage directory stopped being writable (made immutable mid-run): the driver names the path
    and the fix in one line instead of the workers' traceback (issue 48 item 8)."""
    import errno

    from medgpt_ray.run.backoff import unwritable

    denied = PermissionError(errno.EACCES, "Permission denied", "/runs/r/sft/checkpoint-2/trainer_state.json")
    assert unwritable(WorkerGroupError("failed", {0: denied})) == \
        "/runs/r/sft/checkpoint-2/trainer_state.json: Permission denied"
    assert unwritable(WorkerGroupError("failed", {0: KeyError("loss")})) is None
    assert unwritable(died()) is None


def test_a_run_directory_that_cannot_be_written_is_a_config_error_before_ray(tmp_path):
    """/sys is a read-only mount, for root too: a stage directory linked there cannot be written, and the preflight
    says which before Ray starts."""
    from medgpt_ray.config import ConfigError
    from medgpt_ray.run.preflight import check_writable

    run = tmp_path / "run"
    (run / "sft").mkdir(parents=True)
    check_writable(run)  # writable: nothing said, nothing left behind
    assert sorted(p.name for p in run.rglob("*")) == ["sft"]
    try:  # a machine whose /sys takes files has no directory this test can make unwritable for root
        (Path("/sys") / ".medgpt-probe").write_bytes(b"")
        (Path("/sys") / ".medgpt-probe").unlink()
        pytest.skip("/sys is writable here")
    except OSError:
        pass
    (run / "dpo").symlink_to("/sys")
    with pytest.raises(ConfigError, match=r"output_dir: .*run/dpo cannot be written"):
        check_writable(run)
    check_writable(tmp_path / "not-yet")  # a run directory still to be made: nothing to check
