"""Every metric medgpt-ray exports, defined once, served by Ray or by prometheus_client.

Inside Ray (a Ray Train worker, the pipeline driver, a Ray Data task) metrics go
through `ray.util.metrics` and appear on each node's Ray metrics endpoint next to
Ray's own, which prefixes them with `ray_`. In a plain process (a stage called
without Ray) the same definitions are served by prometheus_client on
`$MEDGPT_RAY_METRICS_PORT`, under the same final names (`ray_medgpt_...`), so
one dashboard and one set of alert rules work for both.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Literal

EXPORTED_PREFIX = "ray_"  # what Ray's exporter adds; the standalone path adds it too
PORT_ENV = "MEDGPT_RAY_METRICS_PORT"

TRAIN = ("run", "stage", "rank", "node", "gpu")
RUN_STAGE = ("run", "stage")


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    tags: tuple[str, ...]

    @property
    def exported(self) -> str:
        return EXPORTED_PREFIX + self.name + ("_total" if self.kind == "counter" else "")


DEFINITIONS: tuple[MetricDef, ...] = (
    # training, per stage and worker
    MetricDef("medgpt_train_loss", "gauge", "Training loss at the last logged step", TRAIN),
    MetricDef("medgpt_train_learning_rate", "gauge", "Learning rate at the last logged step", TRAIN),
    MetricDef("medgpt_train_grad_norm", "gauge", "Gradient norm at the last logged step", TRAIN),
    MetricDef("medgpt_train_tokens_per_second", "gauge", "Trained tokens per second (this worker)", TRAIN),
    MetricDef("medgpt_train_samples_per_second", "gauge", "Trained samples per second (this worker)", TRAIN),
    MetricDef("medgpt_train_step_seconds", "gauge", "Wall seconds of the last optimizer step", TRAIN),
    MetricDef("medgpt_train_mfu", "gauge", "Estimated model FLOPs utilisation (0-1)", TRAIN),
    MetricDef("medgpt_train_step", "gauge", "Optimizer steps done", TRAIN),
    MetricDef("medgpt_train_total_steps", "gauge", "Optimizer steps planned", TRAIN),
    MetricDef("medgpt_train_eta_seconds", "gauge", "Estimated seconds to the end of the stage", TRAIN),
    MetricDef("medgpt_train_nonfinite_loss", "gauge", "1 when the last logged loss was NaN or Inf", TRAIN),
    MetricDef("medgpt_train_recompiles", "gauge",
              "Graphs torch.compile compiled after the first optimizer step (compiled layers only)", TRAIN),
    MetricDef("medgpt_gpu_memory_allocated_bytes", "gauge", "torch.cuda.memory_allocated", TRAIN),
    MetricDef("medgpt_gpu_memory_reserved_bytes", "gauge", "torch.cuda.memory_reserved", TRAIN),
    MetricDef("medgpt_gpu_memory_peak_bytes", "gauge", "torch.cuda.max_memory_allocated", TRAIN),
    MetricDef("medgpt_gpu_memory_predicted_peak_bytes", "gauge", "The planner's predicted peak", TRAIN),
    MetricDef("medgpt_gpu_memory_budget_bytes", "gauge", "The planner's per-GPU budget (less the margin)", TRAIN),
    MetricDef("medgpt_gpu_temperature_celsius", "gauge", "GPU temperature (NVML)", TRAIN),
    MetricDef("medgpt_gpu_power_watts", "gauge", "GPU power draw (NVML)", TRAIN),
    MetricDef("medgpt_gpu_sm_clock_mhz", "gauge", "GPU SM clock (NVML)", TRAIN),
    MetricDef("medgpt_gpu_utilization_ratio", "gauge", "GPU utilisation, 0-1 (NVML)", TRAIN),
    MetricDef("medgpt_gpu_throttled", "gauge", "1 when NVML reports a thermal/power/slowdown throttle reason", TRAIN),
    MetricDef("medgpt_gpu_throttle_reasons", "gauge", "NVML clocks-event reasons bitmask", TRAIN),
    # RL stages (grpo, rloo): per reward function, and the generation phase
    MetricDef("medgpt_rl_reward_mean", "gauge", "Mean reward of the last logged steps, per reward function",
              (*TRAIN, "reward")),
    MetricDef("medgpt_rl_reward_std", "gauge", "Reward std of the last logged steps, per reward function",
              (*TRAIN, "reward")),
    MetricDef("medgpt_rl_kl", "gauge", "KL of the policy to its reference at the last logged steps", TRAIN),
    MetricDef("medgpt_rl_completion_length", "gauge", "Mean generated completion length in tokens", TRAIN),
    MetricDef("medgpt_rl_generations_per_second", "gauge", "Completions generated per second (this worker)", TRAIN),
    MetricDef("medgpt_rl_generation_tokens_per_second", "gauge", "Tokens generated per second (this worker)", TRAIN),
    # the eval stage, per compared model (run/eval_report.py)
    MetricDef("medgpt_eval_heldout_loss", "gauge", "Response-only loss on the held-out SFT conversations",
              ("run", "model")),
    MetricDef("medgpt_eval_mean_reward", "gauge", "Mean reward-model score of the model's held-out answers",
              ("run", "model")),
    MetricDef("medgpt_eval_response_tokens", "gauge", "Mean generated tokens per held-out answer", ("run", "model")),
    MetricDef("medgpt_eval_exam_accuracy", "gauge", "Multiple-choice exam accuracy (method: loglik or generated)",
              ("run", "model", "method")),
    MetricDef("medgpt_eval_win_rate", "gauge", "Win rate over the reference model, judged by the reward model "
              "(ties half)", ("run", "model", "reference")),
    MetricDef("medgpt_eval_win_rate_low", "gauge", "Lower end of the win rate's bootstrap 95% interval",
              ("run", "model", "reference")),
    MetricDef("medgpt_eval_win_rate_high", "gauge", "Upper end of the win rate's bootstrap 95% interval",
              ("run", "model", "reference")),
    # data cleaning
    MetricDef("medgpt_clean_records_in", "counter", "Records entering a cleaning operator", ("run", "operator")),
    MetricDef("medgpt_clean_records_out", "counter", "Records leaving a cleaning operator", ("run", "operator")),
    MetricDef("medgpt_clean_quarantined", "counter", "Records quarantined, by reason", ("run", "reason")),
    MetricDef("medgpt_clean_redactions", "counter", "PII redactions, by type", ("run", "pii_type")),
    MetricDef("medgpt_clean_records_per_second", "gauge", "Cleaning throughput (source records)", ("run",)),
    # pipeline
    MetricDef("medgpt_pipeline_stage_state", "gauge", "1 for the stage's current state, 0 for the others",
              (*RUN_STAGE, "state")),
    MetricDef("medgpt_pipeline_stage_wall_seconds", "gauge", "Wall seconds of the stage's last run", RUN_STAGE),
    MetricDef("medgpt_pipeline_stage_restarts", "counter", "Times a stage was resumed after a failure", RUN_STAGE),
    MetricDef("medgpt_pipeline_oom_backoffs", "counter", "OOM back-offs (micro-batch halved)", RUN_STAGE),
)
BY_NAME = {d.name: d for d in DEFINITIONS}
STAGE_STATES = ("pending", "running", "done", "failed", "skipped")


def exported_names() -> set[str]:
    """Every series name Prometheus sees (a counter also has no suffix-less series)."""
    return {d.exported for d in DEFINITIONS}


class Metrics:
    """One process's metric objects, created on first use with the backend this process has."""

    def __init__(self, backend: str, port: int | None = None):
        self.backend = backend
        self.port = port
        self._objects: dict[str, object] = {}
        self._lock = threading.Lock()

    def _get(self, name: str):
        d = BY_NAME[name]
        with self._lock:
            if name not in self._objects:
                self._objects[name] = self._create(d)
            return self._objects[name]

    def _create(self, d: MetricDef):
        if self.backend == "ray":
            from ray.util import metrics as rm

            cls = rm.Gauge if d.kind == "gauge" else rm.Counter
            return cls(d.name, description=d.help, tag_keys=d.tags)
        if self.backend == "prometheus":
            import prometheus_client as pc

            name = EXPORTED_PREFIX + d.name  # prometheus_client appends _total to counters itself
            cls = pc.Gauge if d.kind == "gauge" else pc.Counter
            return cls(name, d.help, labelnames=d.tags)
        return None

    def set(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._record(name, value, tags, "set")

    def inc(self, name: str, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if value > 0:
            self._record(name, value, tags or {}, "inc")

    def _record(self, name: str, value: float, tags: dict[str, str], how: str) -> None:
        obj = self._get(name)
        if obj is None:
            return
        d = BY_NAME[name]
        missing = set(d.tags) - set(tags)
        if missing:
            raise ValueError(f"metric {name}: missing tags {sorted(missing)}")
        tags = {k: str(tags[k]) for k in d.tags}
        if self.backend == "ray":
            getattr(obj, "set" if how == "set" else "inc")(float(value), tags=tags)
        else:
            labelled = obj.labels(**tags)
            getattr(labelled, how)(float(value))


_instances: dict[str, Metrics] = {}
_instance_lock = threading.Lock()


def metrics() -> Metrics:
    """Ray's backend where Ray is up, else prometheus_client when $MEDGPT_RAY_METRICS_PORT is set, else none.

    Decided at every call (cheap): a process that starts Ray later (a test session, a driver) moves to it."""
    backend = _want_backend()
    with _instance_lock:
        if backend not in _instances:
            port = None
            if backend == "prometheus":
                import prometheus_client as pc

                port = int(os.environ[PORT_ENV])
                pc.start_http_server(port, addr=os.environ.get("MEDGPT_RAY_METRICS_ADDR", "127.0.0.1"))
            _instances[backend] = Metrics(backend, port)
        return _instances[backend]


def _want_backend() -> str:
    try:
        import ray

        if ray.is_initialized():
            return "ray"
    except ImportError:
        pass
    return "prometheus" if os.environ.get(PORT_ENV) else "none"


def set_stage_state(run: str, stage: str, state: str) -> None:
    m = metrics()
    for s in STAGE_STATES:
        m.set("medgpt_pipeline_stage_state", 1.0 if s == state else 0.0, {"run": run, "stage": stage, "state": s})


def record_clean_report(run: str, report: dict) -> None:
    """The cleaning funnel of one run, from its report (counters: Prometheus sums across runs by label)."""
    m = metrics()
    for op, counts in report["operators"].items():
        m.inc("medgpt_clean_records_in", counts["in"], {"run": run, "operator": op})
        m.inc("medgpt_clean_records_out", counts["out"], {"run": run, "operator": op})
    for reason, n in report["reasons"].items():
        m.inc("medgpt_clean_quarantined", n, {"run": run, "reason": reason})
    for pii_type, n in report["redactions"].items():
        m.inc("medgpt_clean_redactions", n, {"run": run, "pii_type": pii_type})
    if report.get("source_records_per_s") is not None:
        m.set("medgpt_clean_records_per_second", report["source_records_per_s"], {"run": run})
