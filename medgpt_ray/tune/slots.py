"""The GPU sets (or CPU slots) concurrent trials take turns on: a named actor the trials and the driver share."""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class SlotPool:
    """Disjoint GPU sets (or CPU slots) handed to concurrent trials, chosen together by the placement policy."""

    def __init__(self, groups: list[list[int]]):
        self.groups = groups
        self.free = list(range(len(groups)))
        self.owners: dict[str, int] = {}

    def acquire(self, owner: str = "") -> int | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        if owner:
            self.owners[owner] = slot
        return slot

    def release(self, slot: int) -> None:
        self.owners = {o: s for o, s in self.owners.items() if s != slot}
        if slot not in self.free:
            self.free.append(slot)
            self.free.sort()

    def release_owner(self, owner: str) -> None:
        if owner in self.owners:
            self.release(self.owners[owner])

    def group(self, slot: int) -> list[int]:
        return self.groups[slot]


def slot_releaser(pool_name: str, namespace: str):
    from ray import tune

    class SlotReleaser(tune.Callback):
        """Gives a trial's GPU set back when Tune ends it, also when ASHA stops (kills) it mid-run."""

        def _release(self, trial) -> None:
            try:
                pool = ray.get_actor(pool_name, namespace=namespace)
            except ValueError:
                return  # the sweep is over and its pool gone: nothing to give back
            ray.get(pool.release_owner.remote(trial.trial_id))

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._release(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._release(trial)

    return SlotReleaser()
