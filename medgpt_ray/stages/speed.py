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

from medgpt_ray.stages.checkpointing import decoder_layers


class CompileDecoderLayers(TrainerCallback):
    """Compile every decoder layer when training starts (after peft and DeepSpeed have wrapped the model)."""

    def __init__(self):
        self.compiled = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        for layer in decoder_layers(model):
            layer.compile()
            self.compiled += 1
        if not self.compiled:
            raise RuntimeError("compile: the model has no transformers GradientCheckpointingLayer to compile; "
                               "set the stage's compile: false")


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
