"""A stage's trainer class: TRL's trainer class with the behaviours the stage composes (mixins of this package),
made once per (TRL class, behaviours) before the trainer is constructed (docs/ARCHITECTURE.md). Each behaviour takes
its state as keyword arguments of the constructor and passes the rest on, so a stage builds its trainer with one
call: `trainer_class(SFTTrainer, ShardLoader, SyncFreeLoss)(model=..., shard=..., ...)`."""

from __future__ import annotations

_CLASSES: dict[tuple[type, tuple[type, ...]], type] = {}


def trainer_class(base: type, *behaviours: type) -> type:
    """The subclass of `base` with `behaviours` before it in the MRO (the first listed runs first), cached; `base`
    itself when no behaviour is asked for. The same arguments give the same class (pickling, isinstance checks)."""
    if not behaviours:
        return base
    key = (base, behaviours)
    if key not in _CLASSES:
        name = "".join(b.__name__ for b in behaviours) + base.__name__
        doc = f"{base.__name__} with {', '.join(b.__name__ for b in behaviours)} (medgpt_ray/trainer_kit/)."
        _CLASSES[key] = type(name, (*behaviours, base), {"__doc__": doc, "__module__": __name__})
    return _CLASSES[key]
