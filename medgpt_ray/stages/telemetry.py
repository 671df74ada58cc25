"""Every worker's training metrics (medgpt_ray.metrics): progress, GPU memory against the plan, NVML health."""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.metrics import metrics
from medgpt_ray.stages.outputs import is_rank_zero
from medgpt_ray.stages.speed import RecompileCount
from medgpt_ray.stages.tensorboard import TensorBoardScalars, tensorboard_for

GIB = 2**30
# NVML clocks-event reasons that mean "slowed down" (not idle or app-clock settings): SW power cap, HW slowdown,
# SW/HW thermal slowdown, power brake.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# What TRL's GRPOTrainer and RLOOTrainer (and stages/online_rl.py) log, exported as the RL gauges.
RL_LOGS = (("kl", "medgpt_rl_kl"), ("completions/mean_length", "medgpt_rl_completion_length"),
           ("generation/generations_per_s", "medgpt_rl_generations_per_second"),
           ("generation/tokens_per_s", "medgpt_rl_generation_tokens_per_second"))


class NVMLReader:
    """Temperature, power, SM clock, utilisation and throttle reasons of one GPU; inert without nvidia-ml-py."""

    def __init__(self, physical_index: int | None):
        self.handle = None
        if physical_index is None:
            return
        try:
            import pynvml
        except ImportError:
            return  # the gpu extra is not installed: memory metrics still flow, health metrics do not
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(physical_index)
            self.nvml = pynvml
        except pynvml.NVMLError:
            self.handle = None

    def read(self) -> dict[str, float]:
        if self.handle is None:
            return {}
        n, h = self.nvml, self.handle
        out: dict[str, float] = {}
        for key, fn in (
            ("medgpt_gpu_temperature_celsius", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            ("medgpt_gpu_power_watts", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("medgpt_gpu_sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            ("medgpt_gpu_utilization_ratio", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            ("medgpt_gpu_throttle_reasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ):
            try:
                out[key] = float(fn())
            except (n.NVMLError, AttributeError):
                continue
        if "medgpt_gpu_throttle_reasons" in out:
            out["medgpt_gpu_throttled"] = 1.0 if int(out["medgpt_gpu_throttle_reasons"]) & THROTTLE_MASK else 0.0
        return out


class StageMetrics(TrainerCallback):
    """Exports each worker's progress and health at every optimizer step and every log."""

    def __init__(self, run: str, stage: str, plan, flops_per_token: float | None, peak_flops: float | None,
                 compiles: RecompileCount | None = None, scalars: TensorBoardScalars | None = None):
        self.tags = {"run": run, "stage": stage, "rank": os.environ.get("RANK", "0"), "node": socket.gethostname(),
                     "gpu": _gpu_tag()}
        self.plan = plan
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.compiles = compiles  # when the layers are compiled
        self.scalars = scalars  # rank 0 with report_to: tensorboard: every value also goes to the event files
        self._step = 0
        self.nvml = NVMLReader(None if self.tags["gpu"] == "cpu" else int(self.tags["gpu"]))
        self._t_last = time.monotonic()
        self._t0 = self._t_last
        self._tokens_last = 0
        self._steps_timed = 0

    def _set(self, name: str, value: float) -> None:
        metrics().set(name, value, self.tags)
        if self.scalars is not None:
            self.scalars.add(name, float(value), self._step)

    def on_train_begin(self, args, state, control, **kwargs):
        pred = self.plan.prediction
        if pred is not None:
            self._set("medgpt_gpu_memory_predicted_peak_bytes", pred.peak_gib * GIB)
        if pred is not None and pred.budget_gib is not None:
            self._set("medgpt_gpu_memory_budget_bytes", pred.budget_gib * GIB)
        self._t_last = self._t0 = time.monotonic()
        self._tokens_last = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self._steps_start = self._step = state.global_step  # a resumed run starts mid-way

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self._step = state.global_step
        dt = max(now - self._t_last, 1e-9)
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        # num_input_tokens_seen counts every rank's tokens: this worker's share is 1/world.
        per_worker = (tokens - self._tokens_last) / max(args.world_size, 1) / dt
        samples = self.plan.micro_batch * self.plan.grad_accum / dt
        done = state.global_step - self._steps_start
        eta = (now - self._t0) / done * (state.max_steps - state.global_step) if done > 0 else math.nan
        values: dict[str, float] = {
            "medgpt_train_step": state.global_step, "medgpt_train_total_steps": state.max_steps,
            "medgpt_train_step_seconds": dt, "medgpt_train_tokens_per_second": per_worker,
            "medgpt_train_samples_per_second": samples,
        }
        if eta == eta:
            values["medgpt_train_eta_seconds"] = eta
        if self.compiles is not None and self.compiles.recompiles is not None:
            values["medgpt_train_recompiles"] = self.compiles.recompiles
        if self.flops_per_token and self.peak_flops and per_worker > 0:
            values["medgpt_train_mfu"] = per_worker * self.flops_per_token / self.peak_flops
        values.update(_cuda_memory())
        values.update(self.nvml.read())
        for k, v in values.items():
            self._set(k, v)
        self._t_last, self._tokens_last = now, tokens

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        self._step = state.global_step
        if self.scalars is not None:
            self.scalars.add_eval(logs, state.global_step)
        if "loss" in logs:
            loss = float(logs["loss"])
            self._set("medgpt_train_nonfinite_loss", 0.0 if math.isfinite(loss) else 1.0)
            if math.isfinite(loss):
                self._set("medgpt_train_loss", loss)
        for key, name in (("learning_rate", "medgpt_train_learning_rate"), ("grad_norm", "medgpt_train_grad_norm"),
                          *RL_LOGS):
            if isinstance(logs.get(key), int | float) and math.isfinite(logs[key]):
                self._set(name, float(logs[key]))
        for key, value in logs.items():  # TRL's GRPO and RLOO: rewards/<function>/mean and /std
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "rewards" and parts[2] in ("mean", "std") and \
                    isinstance(value, int | float) and math.isfinite(value):
                metrics().set(f"medgpt_rl_reward_{parts[2]}", float(value), {**self.tags, "reward": parts[1]})
        if self.scalars is not None:
            self.scalars.flush()  # at every log: a live `tensorboard --logdir` follows the stage

    def on_train_end(self, args, state, control, **kwargs):
        if self.scalars is not None:
            self.scalars.flush()  # not closed: the held-out evaluation after training still logs


def _gpu_tag() -> str:
    from medgpt_ray.placement.device import chosen_gpu

    chosen = chosen_gpu()
    if chosen is not None:
        return str(chosen[1])
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.current_device())
    except ImportError:
        pass
    return "cpu"


def _cuda_memory() -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"medgpt_gpu_memory_allocated_bytes": float(torch.cuda.memory_allocated()),
            "medgpt_gpu_memory_reserved_bytes": float(torch.cuda.memory_reserved()),
            "medgpt_gpu_memory_peak_bytes": float(torch.cuda.max_memory_allocated())}


def stage_metrics_callback(inp: Any, compiles: RecompileCount | None = None) -> StageMetrics:
    """The callback for a stage, with the FLOPs model for MFU when the GPU is one we know, and the recompile count
    when the layers are compiled."""
    flops = peak = None
    try:
        import torch

        from medgpt_ray.memory.shapes import load_shape
        from medgpt_ray.memory.throughput import flops_per_token, spec_for

        if torch.cuda.is_available():
            flops = flops_per_token(load_shape(inp.model_path), inp.plan.train_setup(inp.cfg))
            peak = spec_for(torch.cuda.get_device_name()).bf16_tflops * 1e12
    except (KeyError, ValueError, OSError):
        flops = peak = None  # an unknown GPU or shape: no MFU, every other metric still flows
    run = os.path.basename(os.path.dirname(os.path.abspath(inp.out_dir)))
    scalars = tensorboard_for(inp.out, inp.report_to, is_rank_zero())
    return StageMetrics(run, inp.stage, inp.plan, flops, peak, compiles, scalars)
