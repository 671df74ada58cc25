"""`stages.dpo.loss_type` accepts TRL's DPO loss family, and each loss's own parameters are checked where they apply
(issue 17 item 3); the stage hands them to TRL's DPOTrainer as given."""

from __future__ import annotations

import pytest

from medgpt_ray.config import ConfigError, load_config
from medgpt_ray.kinds.dpo.config import DPOLoss

MINIMAL = "model: {path: tiny}\n"


def dpo(tmp_path, **keys):
    p = tmp_path / "c.yaml"
    p.write_text(MINIMAL, encoding="utf-8")
    return load_config(p, [f"stages.dpo.{k}={v}" for k, v in keys.items()]).stages.dpo


def test_every_loss_trl_implements_is_accepted(tmp_path):
    import inspect
    import typing

    from trl.trainer import dpo_trainer

    source = inspect.getsource(dpo_trainer.DPOTrainer)
    ours = typing.get_args(DPOLoss)
    assert len(ours) == 15
    for loss in ours:  # each is a branch of TRL's loss
        assert f'loss_type == "{loss}"' in source, loss
    for loss in ours:
        kw = {"loss_type": loss, **({"label_smoothing": 1e-3} if loss == "exo_pair" else {})}
        assert dpo(tmp_path, **kw).losses == [loss]


def test_a_combination_is_weighted_once_per_loss(tmp_path):
    cfg = dpo(tmp_path, loss_type="[sigmoid, bco_pair, sft]", loss_weights="[0.8, 0.2, 1.0]")
    assert cfg.losses == ["sigmoid", "bco_pair", "sft"] and cfg.loss_weights == [0.8, 0.2, 1.0]
    with pytest.raises(ConfigError, match=r"loss_weights: 2 weights for 3 loss type"):
        dpo(tmp_path, loss_type="[sigmoid, bco_pair, sft]", loss_weights="[0.8, 0.2]")
    with pytest.raises(ConfigError, match=r"names a loss twice"):
        dpo(tmp_path, loss_type="[sigmoid, sigmoid]")


@pytest.mark.parametrize("keys, error", [
    ({"label_smoothing": 0.1}, r"stages.dpo.*label_smoothing: 0.1 applies only to the robust"),
    ({"loss_type": "exo_pair"}, r"exo_pair loss needs it > 0"),
    ({"loss_type": "robust", "label_smoothing": 0.5}, r"stages.dpo.label_smoothing"),
    ({"discopop_tau": 0.1}, r"discopop_tau: only the discopop loss"),
    ({"loss_type": "simpo"}, r"stages.dpo.loss_type"),
])
def test_a_parameter_of_another_loss_is_an_error_naming_the_key(tmp_path, keys, error):
    with pytest.raises(ConfigError, match=error):
        dpo(tmp_path, **keys)


def test_parameters_where_they_apply_are_kept(tmp_path):
    assert dpo(tmp_path, loss_type="robust", label_smoothing=0.1).label_smoothing == 0.1
    assert dpo(tmp_path, loss_type="discopop", discopop_tau=0.1).discopop_tau == 0.1
    assert dpo(tmp_path, loss_type="[sigmoid, aot]", label_smoothing=0.2).label_smoothing == 0.2
