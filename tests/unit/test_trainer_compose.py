"""trainer_kit.compose: a stage's trainer class is one subclass per (TRL class, behaviours), made before the
trainer is constructed, the behaviours first in the MRO and each taking its own constructor keywords."""

from __future__ import annotations

from transformers import Trainer

from medgpt_ray.trainer_kit.compose import trainer_class
from medgpt_ray.trainer_kit.pair_tokens import PairTokenCount
from medgpt_ray.trainer_kit.sharding import ShardLoader
from medgpt_ray.trainer_kit.sync_free import SyncFreeLoss


def test_one_cached_subclass_per_trl_class_and_behaviours():
    cls = trainer_class(Trainer, PairTokenCount, ShardLoader)
    assert cls is trainer_class(Trainer, PairTokenCount, ShardLoader)
    assert cls is not trainer_class(Trainer, ShardLoader, PairTokenCount)
    assert cls.__mro__[1:4] == (PairTokenCount, ShardLoader, Trainer) and issubclass(cls, Trainer)
    assert cls.training_step is PairTokenCount.training_step
    assert cls.get_train_dataloader is ShardLoader.get_train_dataloader
    assert trainer_class(Trainer) is Trainer


def test_each_behaviour_takes_its_keywords_and_passes_the_rest_on():
    class Base:
        def __init__(self, model=None, args=None):
            self.model, self.args = model, args

    cls = trainer_class(Base, ShardLoader)
    shard = {"rank": 0}
    t = cls(model="m", shard=shard, group_by_length=True)
    assert (t.model, t.shard_info, t.group_by_length, t.train_collate) == ("m", shard, True, None)
    assert not hasattr(trainer_class(Base, SyncFreeLoss), "shard_info")
