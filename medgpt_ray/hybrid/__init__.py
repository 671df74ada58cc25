"""Hybrid models' linear-attention layers (Qwen3.5's Gated DeltaNet) as we run them (docs/ARCHITECTURE.md, issue 47).

- segments.py: where a row's conversations start, from the position ids packing gives every conversation, as the
  cu_seqlens flash-linear-attention takes; the gather of a row's segments into a padded batch for the reference path.
- kernels.py: which kernels a call runs on: flash-linear-attention's where they are importable and correct for that
  call (a backward only where this process's probe of fla's backward passed on that GPU), else transformers' own
  PyTorch reference; every refusal is a sentence, never a traceback mid-stage.
- layers.py: the Gated DeltaNet subclass (and the decoder-layer subclass that hands it the position ids),
  installed on a loaded model by a module class swap (models.load_causal_lm).

Bottom layer: imports torch and transformers only, so models.py and every layer above can use it."""
