"""What every stage shares: its inputs, TrainingArguments from the plan, progress, results."""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from medgpt_ray.config import StageConfig
from medgpt_ray.memory.plan import StagePlan
from medgpt_ray.stages import speed
from medgpt_ray.stages.checkpointing import SelectiveCheckpointing, checkpointing_kwargs

Sink = Callable[[dict[str, Any]], None]


@dataclass
class StageInputs:
    stage: str
    cfg: StageConfig
    plan: StagePlan
    model_path: str  # the model this stage starts from (base, or the upstream stage's merged model)
    template: str
    train_file: str  # canonical records, JSONL
    eval_file: str
    out_dir: str  # runs/<name>/<stage>
    seed: int = 42
    resume: bool = True
    report_evals: bool = False  # a Tune trial: each evaluation goes to ray.train.report (ASHA reads it)

    @property
    def out(self) -> Path:
        return Path(self.out_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"


@dataclass
class BuiltStage:
    """A stage's trainer, ready to train: what `run` goes on with and what the memory calibration measures."""

    trainer: Any
    tokenizer: Any
    lora: bool
    eval_size: int = 0  # held-out examples (0: no evaluation)
    extras: dict[str, Any] | None = None  # counts for the result (records, pairs, skipped)
    save_kwargs: dict[str, Any] | None = None  # template / seq_cls for save_outputs


def finish_stage(inp: StageInputs, built: BuiltStage, t0: float,
                 eval_metrics: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """What every stage does after building its trainer: train (resuming), evaluate, save, write result.json."""
    out, resumed = train(built.trainer, inp)
    ev = eval_metrics(built.trainer.evaluate()) if built.eval_size else {}
    save_outputs(built.trainer, inp, built.tokenizer, lora=built.lora, **(built.save_kwargs or {}))
    result = {**base_result(inp, built.trainer, out, resumed, t0), "eval": ev, **(built.extras or {}),
              "output_model": str(inp.out / "model")}
    write_result(inp, result)
    return result


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def latest_checkpoint(ckpt_dir: Path) -> str | None:
    """The newest complete HF checkpoint (trainer_state.json is written last)."""
    if not ckpt_dir.is_dir():
        return None
    found = []
    for p in ckpt_dir.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    return str(max(found)[1]) if found else None


def training_kwargs(inp: StageInputs) -> dict[str, Any]:
    """TrainingArguments shared by every stage, straight from the plan (no "auto" anywhere)."""
    cfg, plan = inp.cfg, inp.plan
    kwargs: dict[str, Any] = {
        "output_dir": str(inp.checkpoint_dir),
        "per_device_train_batch_size": plan.micro_batch,
        "per_device_eval_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "learning_rate": cfg.lr,
        "num_train_epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "warmup_steps": cfg.warmup_ratio,  # a float < 1 is a ratio of the total steps
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.max_grad_norm,
        "lr_scheduler_type": "cosine",
        "logging_steps": cfg.logging_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": cfg.save_steps,
        "save_total_limit": 2,
        "eval_strategy": "steps" if cfg.eval_steps else "no",
        "eval_steps": cfg.eval_steps,
        "bf16": plan.precision in ("bf16", "amp-bf16"),
        "fp16": False,
        "use_cpu": not plan.use_gpu,
        "deepspeed": plan.deepspeed,
        "seed": inp.seed,
        "data_seed": inp.seed,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": plan.use_gpu,
        "ddp_find_unused_parameters": False,
        "include_num_input_tokens_seen": "non_padding",
        "remove_unused_columns": False,
    }
    # Always explicit: TRL's configs default to checkpointing on, the plan may say off.
    kwargs.update(checkpointing_kwargs(plan.ckpt_fraction > 0))
    kwargs["optim"] = optimizer_name(plan)
    flce = plan.fused_ce and inp.stage == "pt"  # sft/dpo: TRL's own chunked head, which Liger must not replace
    # Fused layer ops come from compiling the decoder layers (speed.py) or, without compile, Liger's kernels.
    liger_layers = plan.fused_kernels and not plan.compile
    if flce or liger_layers:
        # Exactly the kernels the plan chose: the estimator models each one's activations.
        kwargs["use_liger_kernel"] = True
        kwargs["liger_kernel_config"] = {"fused_linear_cross_entropy": flce, "cross_entropy": False,
                                         "rope": liger_layers, "rms_norm": liger_layers, "swiglu": liger_layers}
    return kwargs


def optimizer_name(plan: StagePlan) -> str:
    if plan.optim == "adamw-8bit":
        return "adamw_bnb_8bit"
    return "adamw_torch_fused" if plan.use_gpu else "adamw_torch"


def stage_callbacks(inp: StageInputs, sink: Sink | None) -> list[TrainerCallback]:
    from medgpt_ray.stages.telemetry import stage_metrics_callback

    budget = (inp.plan.prediction or {}).get("budget_gib")
    callbacks: list[TrainerCallback] = [StageProgress(inp.stage, inp.out / "metrics.jsonl", sink, budget),
                                        stage_metrics_callback(inp)]
    if 0 < inp.plan.ckpt_fraction < 1:
        callbacks.append(SelectiveCheckpointing(inp.plan.ckpt_fraction))
    if inp.plan.method != "full":
        callbacks.append(speed.Bf16LoraInputs())
    if inp.plan.compile:
        callbacks.append(speed.CompileDecoderLayers())
    if inp.report_evals:
        callbacks.append(EvalToRayTrain())
    if os.environ.get(INJECT_OOM_ENV):
        callbacks.append(InjectedOOM(int(os.environ[INJECT_OOM_ENV])))
    return callbacks


class EvalToRayTrain(TrainerCallback):
    """Every evaluation becomes a Ray Train report on every rank (V2 reports are collective); rank 0 attaches a
    tiny checkpoint, since V2 keeps metrics only with one."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        import tempfile

        import ray.train

        values = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, int | float)}
        values["step"] = state.global_step
        if is_rank_zero():
            with tempfile.TemporaryDirectory() as d:
                Path(d, "eval.json").write_text(json.dumps(values))
                ray.train.report(values, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report(values, checkpoint=None)


# Test hook for the OOM back-off: raise torch.OutOfMemoryError when this optimizer step is reached,
# once per stage directory (a marker file records that it fired, so the resumed attempt goes on).
INJECT_OOM_ENV = "MEDGPT_RAY_INJECT_OOM_AT_STEP"


class InjectedOOM(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        marker = Path(args.output_dir).parent / ".injected_oom"
        if state.global_step >= self.step and not marker.exists():
            barrier()
            if is_rank_zero():
                marker.write_text(str(state.global_step))
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {INJECT_OOM_ENV} at step {self.step})")


def quiet_libraries(trainer=None) -> None:
    """Workers print one progress stream (ours); silence library bars and the per-log dict printer."""
    import warnings

    import datasets
    import transformers
    from transformers.trainer_callback import PrinterCallback

    # TRL and transformers call their own renamed APIs (5.24's gradient -> activation checkpointing).
    warnings.filterwarnings("ignore", message=".*deprecated and will be removed in v6.*", category=FutureWarning)

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if trainer is not None:
        trainer.remove_callback(PrinterCallback)


class StageProgress(TrainerCallback):
    """Rank 0 appends every log to metrics.jsonl and forwards a compact record to the sink.

    Ray Train V2 only reports metrics with a checkpoint, so per-step progress
    travels through this callback instead (ARCHITECTURE.md).
    """

    def __init__(self, stage: str, metrics_path: Path, sink: Sink | None, budget_gib: float | None = None):
        self.stage = stage
        self.budget_gib = budget_gib
        self.metrics_path = metrics_path
        self.sink = sink
        self._t0 = time.monotonic()
        self._last_t = self._t0
        self._last_tokens = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        now = time.monotonic()
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        dt = max(now - self._last_t, 1e-9)
        record: dict[str, Any] = {
            "stage": self.stage,
            "step": state.global_step,
            "total_steps": state.max_steps,
            "time_s": round(now - self._t0, 3),
            **{k: v for k, v in logs.items() if isinstance(v, int | float)},
        }
        gpu = _gpu_peak_gib()
        if gpu is not None:
            record["gpu_peak_gib"] = round(gpu, 3)
            if self.budget_gib:
                record["gpu_budget_gib"] = self.budget_gib
        if "loss" in logs:
            # num_input_tokens_seen already sums every rank's tokens (the Trainer gathers them): the job's rate.
            record["tokens_per_s"] = (tokens - self._last_tokens) / dt
            self._last_t, self._last_tokens = now, tokens
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.sink is not None:
            self.sink(record)


def _gpu_peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def train(trainer, inp: StageInputs) -> Any:
    """trainer.train(), resuming from the newest checkpoint of an interrupted attempt."""
    quiet_libraries(trainer)
    ckpt = latest_checkpoint(inp.checkpoint_dir) if inp.resume else None
    return trainer.train(resume_from_checkpoint=ckpt), ckpt


def loss_summary(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    losses = [h["loss"] for h in log_history if "loss" in h and math.isfinite(h["loss"])]
    return {
        "train_loss_first": losses[0] if losses else None,
        "train_loss_last": losses[-1] if losses else None,
        "logged_losses": len(losses),
    }


def save_outputs(trainer, inp: StageInputs, tokenizer, lora: bool, template=None, seq_cls: bool = False) -> None:
    """adapter/ (LoRA) and model/: a plain HF directory that the next stage and users load directly.
    The adapter is merged on rank 0 into the base reloaded from disk (never into 4-bit weights)."""
    from medgpt_ray import models, templates

    trainer.save_model(str(inp.out / ("adapter" if lora else "model")))
    barrier()
    if is_rank_zero():
        if template is not None:
            # The saved tokenizer carries the template, so downstream stages and users chat the same way.
            templates.apply_to_tokenizer(template, tokenizer)
        if lora:
            tokenizer.save_pretrained(inp.out / "adapter")
            models.merge_adapter_from_disk(Path(inp.model_path), inp.out / "adapter", inp.out / "model",
                                           models.torch_dtype(inp.plan.precision), seq_cls=seq_cls)
        else:
            tokenizer.save_pretrained(inp.out / "model")
    barrier()


def write_result(inp: StageInputs, result: dict[str, Any]) -> None:
    """result.json is the stage's receipt; the pipeline records the manifest entry from it."""
    if not is_rank_zero():
        return
    tmp = inp.out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, inp.out / "result.json")


def _this_worker() -> dict[str, Any]:
    import socket

    import torch

    me: dict[str, Any] = {"rank": int(os.environ.get("RANK", "0")), "host": socket.gethostname(),
                          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": "cpu"}
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        me["device"] = f"cuda:{idx}"
        me["gpu_name"] = props.name
        me["pci_bus_id"] = (f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:"
                            f"{getattr(props, 'pci_device_id', 0):02x}")
    return me


def worker_placement() -> list[dict[str, Any]]:
    """Where every rank ran (host, GPU, PCI bus id), for the manifest's provenance."""
    import torch.distributed as dist

    me = _this_worker()
    if not (dist.is_available() and dist.is_initialized()):
        return [me]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    return sorted(everyone, key=lambda w: w["rank"])


def base_result(inp: StageInputs, trainer, train_output, resumed_from: str | None, t0: float) -> dict[str, Any]:
    return {
        "workers": worker_placement(),
        "stage": inp.stage,
        "steps": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "resumed_from": resumed_from,
        "train_runtime_s": round(train_output.metrics.get("train_runtime", 0.0), 3),
        "wall_s": round(time.monotonic() - t0, 3),
        "world_size": trainer.args.world_size,
        "deepspeed": bool(getattr(trainer, "is_deepspeed_enabled", False)),
        **loss_summary(trainer.state.log_history),
    }
