"""What stage kinds compose into their trainers (docs/ARCHITECTURE.md), as trainer subclasses and callbacks, never
runtime patches (tests/unit/test_no_runtime_patches.py). A stage builds its trainer class once, before constructing
it: `compose.trainer_class(TRLTrainer, *behaviours)`, each behaviour a mixin taking its state as constructor
keywords.

- compose.py: the cached (TRL class, behaviours) -> subclass factory
- shard_sampler.py, sharding.py: a worker trains on its shard as it is (ShardLoader), grouped by length if asked
- prompt_shard.py: GRPO/RLOO prompts in TRL's group order over the worker's shard (PromptShardLoader)
- packed_rows.py, packed_attention.py, packed_counts.py: SFT/rm packing: rows and their collate, which attention
  keeps a row's conversations apart, and the real tokens and examples a packed step counts (PackedCounts)
- sync_free.py: TRL's SFT loss without per-micro-batch host syncs (SyncFreeLoss)
- pair_tokens.py: tokens/s for ORPO/CPO batches (PairTokenCount)
- generation_rate.py: generations/s of GRPO/RLOO (GenerationRate)
- checkpointing.py: the planned share of checkpointed decoder layers (SelectiveCheckpointing, a callback;
  FractionAtEveryForward for trainers whose rollouts switch every layer back on)
- cached_rollouts.py: opd's student samples with the KV cache (CachedRollouts)
- merged_rollouts.py: rollouts on the LoRA adapter merged into the base, the base restored bit-exact afterwards
  (MergedRollouts for grpo/rloo, MergedStudentSamples for opd)
- static_rollouts.py: rollouts on the static decode path (StaticRollouts, StaticStudentSamples)
"""
