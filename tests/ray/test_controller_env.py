"""Ray Train's controller polls a stage's workers every 2 s by default, so each stage ended ~1 s (up to 2 s) after its
workers finished. connect_ray sets the poll interval (run/ray_env.CONTROLLER_ENV) where the user has not, and Ray
Train carries the driver's value to the controller it starts."""

from __future__ import annotations

from medgpt_ray.run.ray_env import CONTROLLER_ENV, connect_ray

VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def test_the_driver_sets_the_controllers_poll_interval_and_ray_train_carries_it(ray_cluster, monkeypatch):
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    monkeypatch.delenv(VAR, raising=False)
    assert connect_ray() == "existing"
    assert CONTROLLER_ENV[VAR] == "0.5" and get_env_vars_to_propagate()[VAR] == "0.5"

    monkeypatch.setenv(VAR, "3")  # a user's own value wins
    connect_ray()
    assert get_env_vars_to_propagate()[VAR] == "3"
