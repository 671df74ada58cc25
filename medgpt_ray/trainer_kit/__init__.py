"""What stage kinds compose into their trainers (docs/ARCHITECTURE.md): sharding, packing, sync-free logging,
telemetry, rewards -- as trainer subclasses and callbacks, never runtime patches."""
