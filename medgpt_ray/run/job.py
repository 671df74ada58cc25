"""StageJob: one stage of a config, from its prepared data to a finished attempt: plan -> place -> run with back-off.

The pipeline runs one per stage of a wave, a Tune sweep one per trial (docs/ARCHITECTURE.md, run/job.py): the same
planning (at rows of seq_len, then at the lengths of the train split), the same placement policy, the same attempts
after an OOM or a dead worker. Both take their data from run/stage_data.py (cleaned `data.raw` included).

The job is the one writer of its stage's plan.json: when the stage starts, when its workers lay the stage out
otherwise than planned (a packed plan their model cannot pack, packed rows sized from a sample: stages/packing.py
sends that plan through the progress channel, run/wave.py hands it here) and after each back-off, which starts from
the plan the workers trained with. The back-off history itself is run/backoff.py's record (backoffs.json), which an
interrupted attempt resumes from.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from medgpt_ray.config import PipelineConfig, stage_kind
from medgpt_ray.data.prepare import PreparedData
from medgpt_ray.memory.budget import Budget
from medgpt_ray.memory.planner import model_shape, plan_stage
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.placement.topology import Topology
from medgpt_ray.run.backoff import resume_plan, run_with_backoff
from medgpt_ray.run.gpu_placement import place_one
from medgpt_ray.run.manifest import write_json_atomic
from medgpt_ray.run.planning import plan_at_lengths
from medgpt_ray.stages.inputs import StageInputs

ATTEMPT_FILE = "attempt.json"


def write_plan(stage_dir: Path, plan: StagePlan) -> None:
    """A stage's plan.json (and deepspeed.json beside it when ZeRO is on); called by StageJob only."""
    write_json_atomic(stage_dir / "plan.json", plan.to_dict())
    if plan.deepspeed is not None:
        write_json_atomic(stage_dir / "deepspeed.json", plan.deepspeed)


@dataclass(frozen=True)
class StageJob:
    cfg: PipelineConfig
    stage: str
    out_dir: Path  # the stage's directory: plan.json, backoffs.json, checkpoints, model, result.json
    echo: Callable[[str], None] = print
    # The plan the stage's workers last said they train with (take_worker_plan), while it runs.
    _worker: dict[str, StagePlan] = field(default_factory=dict, compare=False, repr=False)

    def plan(self, budget: Budget) -> StagePlan:
        """The stage planned at rows of seq_len for `budget` (PlanError: nothing fits; ConfigError: not valid)."""
        c = self.cfg
        return plan_stage(self.stage, c.stages.get(self.stage), c.workers_for(self.stage), c.resources.use_gpu,
                          model_shape(c), budget)

    def plan_at_lengths(self, plan: StagePlan, budget: Budget, base_model: Path,
                        prepared: dict[str, PreparedData]) -> StagePlan:
        """`plan` made again at the lengths of the stage's train split, its plan line said."""
        train_file = prepared[stage_kind(self.stage).data_kind].train_file
        return plan_at_lengths(self.cfg, self.stage, plan, budget, base_model, train_file, self.echo)

    def place(self, plan: StagePlan, topo: Topology, gpus: list[int] | None = None) -> StagePlan:
        """The plan on GPUs of `topo`: `gpus` (a share), unless the config names the stage's own."""
        return place_one(self.cfg, topo, self.stage, plan, gpus, self.echo) if plan.use_gpu else plan

    def same_attempt(self, fingerprint: str) -> bool:
        """Whether the stage directory holds an attempt under `fingerprint` (interrupted, or finished)."""
        attempt = self.out_dir / ATTEMPT_FILE
        return attempt.is_file() and json.loads(attempt.read_text()).get("fingerprint") == fingerprint

    def enter(self, plan: StagePlan, fingerprint: str, fresh: bool) -> StagePlan:
        """Ready the stage directory for an attempt under `fingerprint` and return the plan it runs with. What an
        attempt of another fingerprint (or any, when `fresh`) left is removed: its checkpoints must not be resumed
        from. An interrupted attempt of the same one resumes where its OOM back-offs left it (backoffs.json)."""
        same = self.same_attempt(fingerprint)
        if self.out_dir.exists() and (fresh or not same):
            shutil.rmtree(self.out_dir)
        elif same:
            plan = resume_plan(plan, self.out_dir, self.cfg.stages.get(self.stage))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out_dir / ATTEMPT_FILE, {"fingerprint": fingerprint})
        return plan

    def inputs(self, plan: StagePlan, model_path: str, data: PreparedData, needs: dict[str, str] | None = None,
               reads: dict[str, list[str]] | None = None) -> StageInputs:
        return StageInputs.of(self.cfg, self.stage, plan, model_path, data.train_file, data.eval_file,
                              str(self.out_dir), needs or {}, reads or {})

    def run(self, inputs: StageInputs, attempt_fn: Callable[[int, StageInputs], None]) -> StagePlan:
        """Run the stage's attempts (run/backoff.py) on `inputs.plan`, written to plan.json first and after every
        back-off; the plan of the attempt that succeeded, with the back-offs it took."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_plan(self.out_dir, inputs.plan)
        self._worker.clear()
        r = self.cfg.resources
        ran = run_with_backoff(inputs, attempt_fn, self.cfg.name, r.oom_backoff, self.echo, r.worker_restarts,
                               on_plan=lambda p: write_plan(self.out_dir, p),
                               worker_plan=lambda: self._worker.pop("plan", None))
        return self._worker.get("plan", ran.plan)

    def take_worker_plan(self, plan: dict) -> None:
        """The plan the stage's workers train with, where they laid it out otherwise than planned: plan.json."""
        self._worker["plan"] = StagePlan.from_dict(plan)
        write_plan(self.out_dir, self._worker["plan"])
