"""Rollouts with the KV cache under gradient checkpointing: a behaviour for TRL's GKDTrainer (the opd kind).

TRL 1.16's GKDTrainer builds its sampling GenerationConfig with `use_cache=False` whenever the arguments ask for
gradient checkpointing, so every new token of the student's samples re-runs the whole prompt and answer so far
(measured on the tiny model: decode forwards of 44, 45, ... 49 tokens instead of 1). The cache is safe there: TRL
generates inside `unwrap_model_for_generation`, which switches checkpointing off for the call, and generate runs
without gradients, where transformers 5.24 keeps the cache even on a checkpointing layer. GKDConfig has no
`generation_kwargs` (GRPO's and RLOO's rollouts say `use_cache` through theirs: stages/online_rl.py online_kwargs),
so the trainer's own generation config is set after TRL built it. tests/stages/test_rollout_kv_cache.py."""

from __future__ import annotations

from typing import Any


class CachedRollouts:
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The GenerationConfig TRL passes to generate (it wins over the model's), and the kwargs TRL keeps beside it
        # to override the model's generation_config on transformers < 5: both say cache.
        self.generation_config.use_cache = True
        self.generation_kwargs["use_cache"] = True
