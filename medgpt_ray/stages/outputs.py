"""After the trainer is built: train (resuming), save the model, write result.json; ranks and checkpoints."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from medgpt_ray.models import context_length
from medgpt_ray.stages.inputs import BuiltStage, StageInputs
from medgpt_ray.stages.overlong import LengthTally
from medgpt_ray.trainer_kit.sharding import shard_report

# The key of a stage's held-out metrics in its result.json (the trainer's evaluate()), also in the manifest entry,
# summary.json's stage row, the report and an exported model's card.
HELD_OUT = "eval"


def finish_stage(inp: StageInputs, built: BuiltStage, t0: float,
                 eval_metrics: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """What every stage does after building its trainer: train (resuming), evaluate, save, write result.json."""
    out, resumed = train(built.trainer, inp)
    ev = eval_metrics(built.trainer.evaluate()) if built.eval_size else {}
    save_outputs(built.trainer, inp, built.tokenizer, lora=built.lora, **(built.save_kwargs or {}))
    result = {**base_result(inp, built.trainer, out, resumed, t0), HELD_OUT: ev,
              **stage_extras(built.extras or {}, built.trainer.model), "output_model": str(inp.out / "model")}
    decoder = getattr(built.trainer, "static_decoder", None)  # rollouts on the static path (static_rollouts.py)
    if decoder is not None:
        result["decode"] = decoder.stats()
    merge_s = getattr(built.trainer, "merge_seconds", None)  # merged rollouts (merged_rollouts.py)
    if merge_s is not None:
        result["rollout_merge_s"] = round(merge_s, 3)
    write_result(inp, result)
    return result


def stage_extras(extras: dict[str, Any], model: Any = None) -> dict[str, Any]:
    """The built stage's counts for result.json, its records longer than seq_len (a LengthTally of this worker's
    shard) summed over every worker: the stage's, not rank 0's; with the model's context where its config says."""
    tally = extras.get("overlong")
    if not isinstance(tally, LengthTally):
        return extras
    context = context_length(model) if model is not None else None
    return {**extras, "overlong": LengthTally.merged(all_workers(tally.state())).to_dict(context)}


def all_workers(item: Any) -> list[Any]:
    """`item` from every rank, in rank order (this one's alone outside torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [item]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, item)
    return everyone


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
    The adapter is merged on rank 0 into the base reloaded from disk (never into 4-bit weights). A LoRA reward
    model (seq_cls) also keeps reward_adapter/: its adapter and score head for an RL stage on the same base."""
    from medgpt_ray import models, templates
    from medgpt_ray.stages.reward_adapter import save_reward_adapter

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
            if seq_cls:
                save_reward_adapter(inp.out / "adapter", inp.out, inp.model_path, inp.plan.method)
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


def worker_placement(shard: dict[str, Any] | None = None,
                     compiled: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Where every rank ran (host, GPU, PCI bus id), for the manifest's provenance, the shard of the train
    split it read and trained on, and with compiled layers the graphs it compiled (speed.RecompileCount)."""
    import torch.distributed as dist

    me = _this_worker()
    if shard is not None:
        me["shard"] = shard
    if compiled is not None:
        me["compile"] = compiled
    if not (dist.is_available() and dist.is_initialized()):
        return [me]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    return sorted(everyone, key=lambda w: w["rank"])


def compile_report(trainer) -> dict[str, Any] | None:
    """This worker's compiled graphs (speed.RecompileCount's report); None when the layers were not compiled."""
    from medgpt_ray.stages.speed import RecompileCount

    watch = next((c for c in trainer.callback_handler.callbacks if isinstance(c, RecompileCount)), None)
    return watch.report() if watch is not None else None


def most_recompiles(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The stage's recompiles: the most any worker compiled after its first step (a stall on one rank holds every
    rank at the next all-reduce). Empty without compiled layers: the summary then shows no column."""
    counts = [w["compile"]["recompiles"] for w in workers if "compile" in w]
    return {"recompiles": max((c for c in counts if c is not None), default=None)} if counts else {}


def base_result(inp: StageInputs, trainer, train_output, resumed_from: str | None, t0: float) -> dict[str, Any]:
    workers = worker_placement(shard_report(trainer), compile_report(trainer))
    return {
        "workers": workers,
        "stage": inp.stage,
        "steps": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "resumed_from": resumed_from,
        "train_runtime_s": round(train_output.metrics.get("train_runtime", 0.0), 3),
        "wall_s": round(time.monotonic() - t0, 3),
        "world_size": trainer.args.world_size,
        "deepspeed": bool(getattr(trainer, "is_deepspeed_enabled", False)),
        **loss_summary(trainer.state.log_history),
        **most_recompiles(workers),
    }


@contextlib.contextmanager
def policy_in_eval(trainer) -> Iterator[Any]:
    """The trainer's unwrapped model in eval mode for held-out scoring, its training mode restored after."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
