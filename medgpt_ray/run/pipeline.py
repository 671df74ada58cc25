"""The pipeline on Ray: data -> plan -> place -> run waves -> manifest -> summary.

The stage graph, its waves and fingerprints are pure (run/dag.py); each stage runs as a Ray Train TorchTrainer
built by run/stage_runner.py (shared with Tune sweeps), whose workers call the plain stage function."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from medgpt_ray import models
from medgpt_ray.config import STAGE_KINDS, ConfigError, PipelineConfig, resolved_dict, stage_kind
from medgpt_ray.data import prepare
from medgpt_ray.data.kinds import KINDS, DataFileError, source_kinds
from medgpt_ray.memory.stage_plan import StagePlan, keep_backoffs
from medgpt_ray.metrics import metrics, set_stage_state
from medgpt_ray.placement.topology import Topology
from medgpt_ray.report import write_run_report
from medgpt_ray.report.rundata import PREPARED_FILE, prepared_counts
from medgpt_ray.run import dag, eval_report, pair_report
from medgpt_ray.run.backoff import run_with_backoff
from medgpt_ray.run.gpu_placement import find_topology, place_wave
from medgpt_ray.run.manifest import Manifest, provenance, sha256_json, write_json_atomic, write_plan
from medgpt_ray.run.planning import plan_before_data, plan_by_lengths
from medgpt_ray.run.preflight import check_cpus, check_gpus
from medgpt_ray.run.progress import (
    LiveProgress,
    ProgressActor,
    ProgressPrinter,
    format_summary,
    result_brief,
    summary_entry,
)
from medgpt_ray.run.ray_env import echo
from medgpt_ray.run.stage_runner import RayOptions, run_stage_on_ray, run_task_on_ray
from medgpt_ray.run.upstream import PipelineError, check_reward_adapter, finished_output
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.stages.outputs import latest_checkpoint


@dataclass
class RunOptions:
    from_stage: str | None = None
    only_stage: str | None = None
    echo: Any = echo


@dataclass
class StageOutcome:
    stage: str
    status: str  # done | skipped | disabled | failed | not-run | pending | interrupted
    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None


def _run_dir(cfg: PipelineConfig, connected_to: str) -> Path:
    out = Path(cfg.output_dir)
    if not out.is_absolute() and connected_to == "cluster" and len(ray.nodes()) > 1:
        raise ConfigError(
            f"output_dir: '{cfg.output_dir}' is relative, but this job runs on a {len(ray.nodes())}-node cluster; "
            f"set an absolute path on storage every node sees (NFS), e.g. --set output_dir=/mnt/shared/runs"
        )
    return (out / cfg.name).resolve()


class Pipeline:
    def __init__(self, cfg: PipelineConfig, options: RunOptions | None = None, connected_to: str = "local"):
        self.cfg = cfg
        self.opt = options or RunOptions()
        self.echo = self.opt.echo
        self.run_dir = _run_dir(cfg, connected_to)
        self.manifest = Manifest(self.run_dir / "manifest.json")
        self.storage_path = cfg.resources.storage_path or str(self.run_dir / "_ray")
        self._topo: Topology | None = None
        self._baselines: dict[str, Any] | None = None  # run_baselines, once the data is prepared
        # Set on Ctrl-C: a stage thread that then fails (its actors go down with the driver) is not a failure.
        self._interrupted = threading.Event()
        for s in (self.opt.from_stage, self.opt.only_stage):
            if s is not None and s not in STAGE_KINDS:
                raise ConfigError(f"stage '{s}' is not one of {', '.join(STAGE_KINDS)}")
            if s is not None and not cfg.stages.get(s).enabled:
                raise ConfigError(f"stage '{s}' is disabled in the config (stages.{s}.enabled: false)")

    # ---- planning -------------------------------------------------------------------------
    def _clean_raw(self, prov: dict[str, Any]) -> None:
        """Clean `data.raw` with Ray Data as the pipeline's first step; skipped when the sources, the cleaning
        options and the code are unchanged since the last cleaning of this run."""
        from medgpt_ray.data.clean import clean_corpus

        clean_dir, clean_cfg = self.run_dir / "clean", self.cfg.data.clean_config()  # PII step off iff redact_pii
        try:
            sources = prepare.sources_fingerprint(self.cfg.data.raw)
        except DataFileError as e:
            raise ConfigError(f"data.raw: {e}") from None
        fp = sha256_json({"sources": sources, "clean": clean_cfg.model_dump(mode="json"),
                          "code": {"git_commit": prov["git_commit"], "packages": prov["packages"]}})
        stamp = clean_dir / "fingerprint.json"
        if stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == fp:
            self.echo(f"[clean] raw sources unchanged since the last cleaning, using {clean_dir / 'data'}")
            return
        stamp.unlink(missing_ok=True)
        report = clean_corpus(self.cfg.data.raw, clean_dir, "auto", clean_cfg, echo=self.echo,
                              live_progress=LiveProgress, overwrite=True)  # runs/<name>/clean is the run's own
        if not report["adds_up"]:
            raise PipelineError(f"cleaning of data.raw does not add up; see {clean_dir / 'report.json'}")
        write_json_atomic(stamp, {"fingerprint": fp})

    def _own_paths(self, kind: str) -> list[str]:
        cleaned = self.run_dir / "clean" / "data" / kind
        return self.cfg.data.paths(kind) + ([str(cleaned)] if self.cfg.data.raw and cleaned.is_dir() else [])

    def _data_paths(self, kind: str) -> list[str]:
        """The files prepared as `kind` data: its own and those of the kinds also read as it (data/kinds.py)."""
        return [p for k in source_kinds(kind) for p in self._own_paths(k)]

    def _data_kinds(self) -> list[str]:
        """The kinds an enabled stage trains on, and every other kind the config gives data for (read, cleaned
        and split now, so a bad file shows before the stage that needs it exists or is enabled)."""
        needed = {stage_kind(s).data_kind for s in self.cfg.enabled_stages()}
        return sorted(needed | {k for k in KINDS if k not in needed and self._own_paths(k)})

    def _prepare_data(self, any_stage_runs: bool = True) -> dict[str, prepare.PreparedData]:
        """The splits of every data kind (none when no stage runs), then the preference baselines on them."""
        prepared: dict[str, prepare.PreparedData] = {}
        data, kinds = self.cfg.data, self._data_kinds() if any_stage_runs else []
        if not data.redact_pii and kinds:
            self.echo(prepare.not_redacted_line((["raw"] if data.raw else []) + kinds))
        for kind in kinds:
            try:
                d = prepare.prepare_kind(kind, self._data_paths(kind), self.run_dir / "data", data.eval_fraction,
                                 data.max_records, data.pii_types())
            except DataFileError as e:
                raise ConfigError(f"data.{kind}: {e}") from None
            self.echo(prepare.prepared_line(d))
            prepared[kind] = d
        if prepared:  # a run with every stage skipped keeps the counts the run before it wrote
            write_json_atomic(self.run_dir / "data" / PREPARED_FILE, prepared_counts(prepared), mode=0o600)
        self._baselines = pair_report.run_baselines(self.cfg, self.run_dir / "data", prepared)
        return prepared

    def _data_fingerprint(self, kind: str) -> str:
        try:
            return prepare.data_fingerprint(self._data_paths(kind), self.cfg.data)
        except DataFileError as e:
            raise ConfigError(f"data.{kind}: {e}") from None

    # ---- running --------------------------------------------------------------------------
    def _fingerprints(self, plans: dict[str, StagePlan], base_config: dict[str, Any], prov: dict[str, Any]
                      ) -> dict[str, str]:
        """Each enabled stage's fingerprint, upstream first. They hash the data sources' bytes: the train/held-out
        files are prepared only if a stage runs."""
        kinds = {k for s in self.cfg.enabled_stages() for k in (stage_kind(s).data_kind, *stage_kind(s).reads)}
        data_fps = {kind: self._data_fingerprint(kind) for kind in kinds}
        fingerprints: dict[str, str] = {}
        for s in self.cfg.enabled_stages():
            up = dag.effective_from(self.cfg, s)
            needs = {n: fingerprints[n] for n in self.cfg.stages.get(s).needs}
            data_fp = dag.stage_data_fingerprint(stage_kind(s), data_fps)
            fingerprints[s] = dag.fingerprint(self.cfg, s, plans[s], data_fp, fingerprints.get(up) if up else None,
                                              base_config, prov, needs)
        return fingerprints

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir / "config.resolved.json", resolved_dict(self.cfg))
        base_path = models.resolve_model_path(self.cfg.model.path)
        base_config = models.model_config_dict(base_path)
        prov = provenance()
        self.manifest.set_run_info({"config": resolved_dict(self.cfg), "base_model_path": str(base_path), **prov})
        resources = ray.cluster_resources()  # a joined cluster's, known only now
        check_cpus(self.cfg, resources.get("CPU", 0), "the Ray cluster")
        check_gpus(self.cfg, resources.get("GPU", 0), "the Ray cluster")
        plans, budget = plan_before_data(self.cfg)
        if self.cfg.data.raw:
            self._clean_raw(prov)
        order = self.cfg.enabled_stages()
        forced = self._forced_stages(order)
        if self.opt.only_stage:
            order = [self.opt.only_stage]
        fingerprints = self._fingerprints(plans, base_config, prov)
        to_run = [s for s in order if s in forced or not self.manifest.is_done(s, fingerprints[s])]
        # A stage that reruns makes everything downstream of it rerun too.
        for s in self.cfg.enabled_stages():
            if any(d in to_run for d in dag.dependencies(self.cfg, s)) and s not in to_run and s in order:
                to_run.append(s)
        for s in order:
            set_stage_state(self.cfg.name, s, "pending" if s in to_run else "skipped")
            if s not in to_run:
                self.echo(f"[{s:>3}] done in manifest (fingerprint {fingerprints[s][:12]}), skipping")
        self._check_reward_adapters(to_run, base_path)
        prepared = self._prepare_data(bool(to_run))
        plans = plan_by_lengths(self.cfg, plans, budget, base_path, to_run, prepared, self.echo)

        namespace = ray.get_runtime_context().namespace
        actor_name = f"medgpt-progress-{self.cfg.name}-{os.getpid()}"
        actor = ProgressActor.options(name=actor_name, namespace=namespace).remote()
        printer = ProgressPrinter(self.cfg.progress_every, echo=self.echo)
        outcomes: dict[str, StageOutcome] = {}
        # From here on summary.json says what this run is doing, never what an earlier one did: a stage about to
        # retrain is "pending" (its old model may be replaced), one cut by Ctrl-C "interrupted"; after every wave.
        self._summary(self._with_pending(outcomes, to_run), time.monotonic() - t0, quiet=True)
        try:
            for wave in self._waves([s for s in self.cfg.enabled_stages() if s in order]):
                runnable = [s for s in wave if s in to_run]
                for s in wave:
                    if s not in to_run:
                        outcomes[s] = StageOutcome(s, "skipped", self.manifest.entry(s) or {})
                if not runnable:
                    continue
                inputs = {s: self._inputs(s, plans[s], fingerprints[s], base_path, prepared, s in forced)
                          for s in runnable}
                self._run_wave(runnable, inputs, fingerprints, actor, actor_name, namespace, printer, outcomes)
                self._summary(self._with_pending(outcomes, to_run), time.monotonic() - t0, quiet=True)
                failed = [o for o in outcomes.values() if o.status == "failed"]
                if failed:
                    break
        except KeyboardInterrupt:
            self._interrupted.set()
            self._summary(self._with_pending(outcomes, to_run, "interrupted"), time.monotonic() - t0, quiet=True)
            raise
        finally:
            printer.feed(ray.get(actor.drain.remote()))
            ray.kill(actor)
        for s in self.cfg.stages.kinds():
            if s not in outcomes:
                status = "disabled" if not self.cfg.stages.get(s).enabled else "not-run"
                outcomes[s] = StageOutcome(s, status, self.manifest.entry(s) or {} if status == "not-run" else {})
        summary = self._summary(outcomes, time.monotonic() - t0)
        failed = [o for o in outcomes.values() if o.status == "failed"]
        if failed:
            raise PipelineError(f"stage {failed[0].stage} failed: {failed[0].error} "
                                f"(re-run the same command to resume; run dir {self.run_dir})")
        return summary

    def _check_reward_adapters(self, to_run: list[str], base_path: Path) -> None:
        """A stage about to run on the reward adapter of an rm finished in an earlier run: that adapter is there
        and fits this stage's base (an rm that reruns now writes its own; its `from` then reruns too)."""
        if "rm" in to_run:
            return
        for s in to_run:
            if getattr(self.cfg.stages.get(s), "reward_shared_base", False) is True:
                check_reward_adapter(self.cfg, self.manifest, s, self._upstream_model(s, base_path))

    def _forced_stages(self, order: list[str]) -> set[str]:
        return dag.forced_stages(self.cfg, order, self.opt.from_stage, self.opt.only_stage)

    def _waves(self, stages: list[str]) -> list[list[str]]:
        return dag.waves(self.cfg, stages)

    def _output_of(self, up: str, stage: str, how: str) -> str:
        return finished_output(self.manifest, up, stage, how)

    def _upstream_model(self, stage: str, base_path: Path) -> Path:
        up = dag.effective_from(self.cfg, stage)
        return base_path if up is None else Path(self._output_of(up, stage, "starts from"))

    def _inputs(self, stage: str, plan: StagePlan, fingerprint: str, base_path: Path,
                prepared: dict[str, prepare.PreparedData], forced: bool) -> StageInputs:
        stage_dir = self.run_dir / stage
        attempt = stage_dir / "attempt.json"
        same_attempt = attempt.is_file() and json.loads(attempt.read_text()).get("fingerprint") == fingerprint
        if stage_dir.exists() and (forced or not same_attempt):
            # Checkpoints of another configuration must not be resumed from.
            shutil.rmtree(stage_dir)
            self.manifest.forget(stage)
        if same_attempt and (stage_dir / "plan.json").is_file():
            # An interrupted attempt that had backed off after an OOM resumes at the smaller micro-batch.
            plan = keep_backoffs(plan, StagePlan.from_dict(json.loads((stage_dir / "plan.json").read_text())),
                                 self.cfg.stages.get(stage))
        stage_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(attempt, {"fingerprint": fingerprint})
        write_plan(stage_dir, plan)
        data = prepared[stage_kind(stage).data_kind]
        needs = {n: self._output_of(n, stage, "needs") for n in self.cfg.stages.get(stage).needs}
        reads = {k: [prepared[k].train_file, prepared[k].eval_file] for k in stage_kind(stage).reads if k in prepared}
        return StageInputs.of(self.cfg, stage, plan, str(self._upstream_model(stage, base_path)), data.train_file,
                              data.eval_file, str(stage_dir), needs, reads)

    def _fits_side_by_side(self, stages: list[str], plans: dict[str, StagePlan]) -> bool:
        if len(stages) < 2:
            return False
        avail = ray.available_resources()
        need_cpu = sum(plans[s].num_workers * self.cfg.resources.cpus_per_worker for s in stages)
        need_gpu = sum(plans[s].num_workers for s in stages if plans[s].use_gpu)
        return need_cpu <= avail.get("CPU", 0) and need_gpu <= avail.get("GPU", 0)

    def _run_wave(self, stages, inputs, fingerprints, actor, actor_name, namespace, printer, outcomes) -> None:
        plans = {s: inputs[s].plan for s in stages}
        parallel = self._fits_side_by_side(stages, plans)
        if parallel:
            self.echo(f"running {' and '.join(stages)} side by side")
        if any(plans[st].use_gpu for st in stages):
            if self._topo is None:
                self._topo = find_topology(self.cfg)
            plans = place_wave(self.cfg, self._topo, stages, plans, parallel, self.run_dir, self.echo)
            inputs = {s: replace(inputs[s], plan=plans[s]) for s in stages}
        threads: dict[str, threading.Thread] = {}
        results: dict[str, StageOutcome] = {}

        def work(stage: str) -> None:
            t0 = time.monotonic()
            p = plans[stage]
            how = (f"{p.method}, {p.precision}, {p.num_workers} worker(s) x micro-batch {p.micro_batch} x accum "
                   f"{p.grad_accum}, ZeRO {p.zero_stage}, model" if stage_kind(stage).trains else
                   f"one Ray task on {'a GPU' if p.use_gpu else 'CPU'}, reading {', '.join(inputs[stage].needs)} "
                   f"and the reference model")
            self.echo(f"[{stage:>3}] start: {how} {inputs[stage].model_path}")
            tags = {"run": self.cfg.name, "stage": stage}
            set_stage_state(self.cfg.name, stage, "running")
            if latest_checkpoint(inputs[stage].checkpoint_dir):
                metrics().inc("medgpt_pipeline_stage_restarts", 1, tags)  # resuming an interrupted attempt
            try:
                name = f"{self.cfg.name}-{stage}-{fingerprints[stage][:10]}"
                runner = run_stage_on_ray if stage_kind(stage).trains else run_task_on_ray
                ran = run_with_backoff(
                    inputs[stage],
                    lambda attempt, inp: runner(inp, RayOptions(
                        self.storage_path, name + (f"-b{attempt}" if attempt else ""),
                        self.cfg.resources.cpus_per_worker, progress=(actor_name, namespace))),
                    self.cfg.name, self.cfg.resources.oom_backoff, self.echo, self.cfg.resources.worker_restarts)
                plans[stage] = ran.plan  # with the back-offs it took
                result_path = Path(inputs[stage].out_dir) / "result.json"
                result = json.loads(result_path.read_text(encoding="utf-8"))
                if stage_kind(stage).trains and not Path(result["output_model"], "config.json").is_file():
                    raise PipelineError(f"stage {stage} finished without a model in {result['output_model']}")
                self.manifest.record(stage, {
                    "fingerprint": fingerprints[stage], "output_model": result["output_model"],
                    "plan": plans[stage].to_dict(), "result": result, "workers": result.get("workers", []),
                })
                results[stage] = StageOutcome(stage, "done", result, time.monotonic() - t0)
                eval_report.publish(self.cfg.name, result)
                self.echo(f"[{stage:>3}] done in {results[stage].wall_s:.1f}s: {result_brief(result)}")
            except Exception as e:  # reported in the summary and re-raised by run() as PipelineError
                if self._interrupted.is_set():
                    return  # the run was cut by Ctrl-C and says so; this is its Ray work going down with it
                results[stage] = StageOutcome(stage, "failed", {}, time.monotonic() - t0, f"{type(e).__name__}: {e}")
                self.echo(f"[{stage:>3}] FAILED after {results[stage].wall_s:.1f}s: {results[stage].error}")
            set_stage_state(self.cfg.name, stage, results[stage].status)
            metrics().set("medgpt_pipeline_stage_wall_seconds", results[stage].wall_s, tags)

        for s in stages:
            threads[s] = threading.Thread(target=work, args=(s,), name=f"stage-{s}", daemon=True)
            threads[s].start()
            if not parallel:
                self._wait(threads[s], actor, printer)
        for t in threads.values():
            self._wait(t, actor, printer)
        for s in stages:
            outcomes[s] = results[s]

    def _wait(self, thread: threading.Thread, actor, printer: ProgressPrinter) -> None:
        while thread.is_alive():
            thread.join(timeout=1.0)
            printer.feed(ray.get(actor.drain.remote()))

    # ---- reporting ------------------------------------------------------------------------
    def _with_pending(self, outcomes: dict[str, StageOutcome], to_run: list[str], status: str = "pending"
                      ) -> dict[str, StageOutcome]:
        """`outcomes` so far, plus `status` for the stages this run still has to finish and the manifest's
        word for the rest (skipped: done earlier)."""
        full = dict(outcomes)
        for s in self.cfg.stages.kinds():
            if s in full:
                continue
            if not self.cfg.stages.get(s).enabled:
                full[s] = StageOutcome(s, "disabled")
            elif s in to_run:
                full[s] = StageOutcome(s, status)
            else:
                full[s] = StageOutcome(s, "skipped", self.manifest.entry(s) or {})
        return full

    def _summary(self, outcomes: dict[str, StageOutcome], wall_s: float, quiet: bool = False) -> dict[str, Any]:
        stages = {}
        for s in self.cfg.stages.kinds():
            o = outcomes[s]
            r = o.result.get("result", o.result) if o.status in ("skipped", "not-run") else o.result
            wall = round(o.wall_s, 2) if o.status in ("done", "failed") else r.get("wall_s")
            stages[s] = summary_entry(o.status, r, wall, o.error)
        summary = {"name": self.cfg.name, "run_dir": str(self.run_dir), "wall_s": round(wall_s, 2),
                   "stages": stages, **pair_report.summary_fields(self.cfg, stages, self._baselines),
                   **eval_report.summary_fields(outcomes.get("eval"))}
        write_json_atomic(self.run_dir / "summary.json", summary)
        if not quiet:  # the run's end, also after a failed stage: the table, then runs/<name>/report.html
            self.echo(format_summary(summary))
            write_run_report(self.run_dir, self.echo)
        return summary
