"""Plan every enabled stage of a pipeline config: the model's shape, the budget, one StagePlan each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.memory.budget import GPUMemory, tightest_local_gpu
from medgpt_ray.memory.planner import Budget, PlanError, StagePlan, make_budget, plan_stage
from medgpt_ray.memory.shapes import ModelShape, ShapeError, load_shape

GpuProbe = Callable[[], GPUMemory | None]


def model_shape(cfg: PipelineConfig) -> ModelShape:
    path = cfg.model.path
    if path == "tiny" or (Path(path).expanduser() / "config.json").is_file():
        return load_shape(path)
    if cfg.model.shape:
        try:
            return load_shape(cfg.model.shape)
        except ShapeError as e:
            raise ConfigError(f"model.shape: {e}") from None
    raise ConfigError(f"model.path '{path}' has no config.json here to plan memory from; set model.shape to a "
                      f"preset (e.g. qwen2.5-7b) to plan on a machine without the model")


def resolve_budget(cfg: PipelineConfig, probe: GpuProbe | None, default_gpu_gib: float | None) -> Budget:
    r = cfg.resources
    # Host RAM for CPU offload: the config's, else what was read on a GPU node (never this laptop's when the
    # GPU side comes from the config).
    host = {"host_gib": r.host_memory_gib, "gpus_per_node": r.gpus_per_node}
    if r.gpu_memory_gib is not None:
        return make_budget(r.gpu_memory_gib, r.memory_margin_gib, r.gpu_type, r.use_gpu, "resources.gpu_memory_gib",
                           **host)
    if not r.use_gpu:
        return make_budget(None, 0.0, "auto", False, "cpu")
    gpu = (probe or tightest_local_gpu)()
    if gpu is not None:
        return make_budget(round(gpu.allocator_gib, 2), r.memory_margin_gib, r.gpu_type, True,
                           f"{gpu.name}: {gpu.free_gib:.1f} GiB free of {gpu.total_gib:.1f}, less the CUDA context",
                           detected_name=gpu.name,
                           host_gib=r.host_memory_gib if r.host_memory_gib is not None else gpu.host_available_gib,
                           gpus_per_node=r.gpus_per_node or gpu.gpus_on_node)
    if default_gpu_gib is None:
        raise ConfigError("resources.gpu_memory_gib: no GPU could be read to size the plan; set it to the "
                          "per-GPU memory of the cluster's cards (e.g. 24 for an RTX 4090)")
    return make_budget(default_gpu_gib, r.memory_margin_gib, r.gpu_type, True, "assumed: no GPU here", **host)


def plan_all(cfg: PipelineConfig, probe: GpuProbe | None = None,
             default_gpu_gib: float | None = None) -> tuple[dict[str, StagePlan], dict[str, str]]:
    """Plans for the enabled stages, and for each stage that cannot be planned, the message why."""
    shape = model_shape(cfg)
    budget = resolve_budget(cfg, probe, default_gpu_gib)
    plans: dict[str, StagePlan] = {}
    errors: dict[str, str] = {}
    for stage in cfg.enabled_stages():
        try:
            plans[stage] = plan_stage(stage, cfg.stages.get(stage), cfg.workers_for(stage), cfg.resources.use_gpu,
                                      shape, budget)
        except PlanError as e:
            errors[stage] = str(e)
    return plans, errors
