"""Make a training step cheaper without changing what it computes.

Measured on the 7B LoRA SFT step (bench/step_overhead_probe.py, bench/results/
step_overhead_probe_h200.json): with a fast GPU the step is bound by the
hundreds of small ops around each LoRA projection, not by the matmuls.

- Compiled decoder layers: each decoder layer is compiled in place
  (`nn.Module.compile`, the regional compilation of PyTorch's recipe: one
  compile serves every layer). Inductor fuses the norms, SwiGLU, RoPE, LoRA's
  dropout/scale/add and the dtype casts, and the CPU launches far fewer kernels.
  Gradient checkpointing stays outside the compiled region (HF's
  GradientCheckpointingLayer.__call__ wraps the compiled forward), so selective
  checkpointing and TRL DPO's toggling work as before.
- LoRA inputs stay bf16: peft keeps the adapters in fp32 and casts every
  adapted input to fp32 before dropout; under the Trainer's bf16 autocast the
  adapter matmul runs in bf16 anyway, so that cast is a full-size copy (and a
  fp32 dropout) per projection for nothing. The adapters stay fp32 (the
  optimizer's master weights); only the input cast goes.
"""

from __future__ import annotations

from transformers import TrainerCallback

from medgpt_ray.trainer_kit.checkpointing import decoder_layers

# Graphs dynamo keeps per compiled function (all decoder layers share one) before it runs new variants uncompiled,
# silently: torch's default is 8. Each path a step takes is its own graph, and each turns dynamic at its second
# length: on the H200 (transformers 5.17) LoRA DPO's paths (checkpointed and plain layers, the training pass and the
# adapter-off reference pass) and the first evaluation came to exactly 8 with bucketed lengths
# (bench/results/compile_shapes_probe_h200.jsonl); with transformers 5.24 (CPU) the same passes needed more than 8 by
# their second step. Lengths are bounded (memory/lengths.BUCKET), so a higher
# limit buys no stalls in steady state, only every path compiled.
RECOMPILE_LIMIT = 32


class CompileDecoderLayers(TrainerCallback):
    """Compile every decoder layer when training starts (after peft and DeepSpeed have wrapped the model)."""

    def __init__(self):
        self.compiled = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import torch

        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        for layer in decoder_layers(model):
            layer.compile()
            self.compiled += 1
        if not self.compiled:
            raise RuntimeError("compile: the model has no transformers GradientCheckpointingLayer to compile; "
                               "set the stage's compile: false")


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process: dynamo counts one per graph it hands to the backend, for a
    path's first call (training forward, DPO's no-grad reference pass, evaluation) and for every recompile (a new
    input length, a dimension turned dynamic, a mask present or not)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileCount(TrainerCallback):
    """Graphs compiled after the attempt's first optimizer step: that step compiles every path it takes, so each
    one after it is a stall of seconds (tens on a 7B layer) that bounded shapes should prevent; in steady state the
    count stays flat. Per process (a resumed attempt counts afresh); None before the first step ends."""

    def __init__(self):
        self.start = compiled_graphs()  # graphs this process compiled before (an earlier stage in a plain process)
        self.after_first_step: int | None = None
        self.at_train_end: dict[str, int | None] | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.after_first_step is None:
            self.after_first_step = compiled_graphs()

    def on_train_end(self, args, state, control, **kwargs):
        self.at_train_end = self._counts()

    @property
    def recompiles(self) -> int | None:
        return None if self.after_first_step is None else compiled_graphs() - self.after_first_step

    def _counts(self) -> dict[str, int | None]:
        return {"compiled_graphs": compiled_graphs() - self.start, "recompiles": self.recompiles}

    def report(self) -> dict[str, int | None]:
        """For the stage's result: graphs compiled in the attempt's training, and how many after its first step (as
        training ended: the final evaluation's first pass compiles too, and stalls no step)."""
        return self.at_train_end if self.at_train_end is not None else self._counts()


class Bf16LoraInputs(TrainerCallback):
    """Stop peft's fp32 cast of each adapted input when the Trainer trains under bf16 autocast."""

    def __init__(self):
        self.layers: list = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not args.bf16:  # without autocast the fp32 adapter needs its fp32 input
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.layers = [m for m in model.modules()
                       if isinstance(m, BaseTunerLayer) and getattr(m, "cast_input_dtype_enabled", False)]
        for m in self.layers:
            m.cast_input_dtype_enabled = False

    def on_train_end(self, args, state, control, **kwargs):
        # Calls outside the Trainer's autocast (a user's generate on the returned model) need the cast back.
        for m in self.layers:
            m.cast_input_dtype_enabled = True
