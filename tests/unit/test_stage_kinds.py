"""The stage graph is data: a new stage kind is a module, a config class and a registry entry, nothing else.

This file is all three for a trivial kind, `echo`: its module is this file (build/run below), its config class
EchoConfig, its entry registered by the fixture. The config, the graph, the planner and the stage dispatch take
it from the registry; nothing in medgpt_ray/ names it.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import pytest

from medgpt_ray.config import STAGE_KINDS, ConfigError, PipelineConfig, StageConfig, StageKind, register_stage_kind
from medgpt_ray.run import dag


class EchoConfig(StageConfig):
    """A stage that trains nothing: it hands on the model it starts from, saying `greeting`."""

    greeting: str = "hello"


def run(inp, sink=None, callbacks=()) -> dict[str, Any]:
    """The kind's stage function (what medgpt_ray.stages.run_stage calls): copy the input model, write the receipt."""
    model = inp.out / "model"
    shutil.copytree(inp.model_path, model)
    result = {"stage": inp.stage, "steps": 0, "greeting": inp.cfg.greeting, "needs": inp.needs,
              "output_model": str(model)}
    (inp.out / "result.json").write_text(json.dumps(result))
    if sink is not None:
        sink({"stage": inp.stage, "step": 0})
    return result


def build(inp, sink=None, callbacks=()):
    raise NotImplementedError("echo trains nothing")


@pytest.fixture
def echo():
    kind = register_stage_kind(StageKind("echo", EchoConfig, data_kind="sft", default_from="sft",
                                         defaults={"method": "lora"}, module=__name__, memory_model="sft"))
    yield kind
    del STAGE_KINDS["echo"]


def make(**stages) -> PipelineConfig:
    return PipelineConfig.model_validate({"model": {"path": "tiny"}, "stages": stages})


def test_a_registered_kind_is_configured_ordered_and_waved_like_the_built_in_ones(echo, tmp_path):
    from medgpt_ray.config import load_config

    cfg = make(echo={"greeting": "hi", "lr": 1e-3})
    assert isinstance(cfg.stages.echo, EchoConfig) and cfg.stages.echo.greeting == "hi"
    assert cfg.stages.echo.method == "lora"  # the kind's own default
    assert cfg.enabled_stages() == ["pt", "sft", "rm", "dpo", "echo"]
    assert dag.waves(cfg, cfg.enabled_stages()) == [["pt"], ["sft"], ["rm", "dpo", "echo"]]
    needs_rm = make(echo={"needs": ["rm"]})
    assert dag.waves(needs_rm, needs_rm.enabled_stages()) == [["pt"], ["sft"], ["rm", "dpo"], ["echo"]]
    assert dag.forced_stages(needs_rm, needs_rm.enabled_stages(), "rm", None) == {"rm", "echo"}
    typo = tmp_path / "c.yaml"
    typo.write_text("model: {path: tiny}\nstages: {echo: {gretting: hi}}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key 'stages.echo.gretting'"):
        load_config(typo)


def test_from_and_needs_are_checked_and_a_disabled_from_hands_over_its_input(echo):
    cfg = make(echo={"from": "pt"}, sft={"enabled": False})
    assert dag.effective_from(cfg, "echo") == "pt" and dag.effective_from(cfg, "rm") == "pt"
    assert dag.effective_from(make(echo={"from": "pt"}, pt={"enabled": False}), "echo") is None  # the base model
    with pytest.raises(ValueError, match=r"stages.echo.needs: stage 'rm' is disabled \(stages.rm.enabled: false\)"):
        make(echo={"needs": ["rm"]}, rm={"enabled": False})
    with pytest.raises(ValueError, match="is a cycle"):
        make(sft={"from": "echo"})
    with pytest.raises(ValueError, match="'ppo' is not another stage"):
        make(echo={"needs": ["ppo"]})


def test_the_planner_and_the_stage_dispatch_take_the_kind_from_the_registry(echo, tiny_model, tmp_path):
    from medgpt_ray.memory.planner import plan_all
    from medgpt_ray.stages import run_stage
    from medgpt_ray.stages.inputs import StageInputs

    cfg = make(echo={"effective_batch": 4, "seq_len": 64}, pt={"enabled": False}, rm={"enabled": False},
               dpo={"enabled": False})
    plans, errors = plan_all(cfg)
    assert errors == {} and plans["echo"].stage == "echo"
    assert plans["echo"].train_setup(cfg.stages.echo).stage == "sft"  # planned with sft's memory model
    out = tmp_path / "echo"
    out.mkdir()
    inp = StageInputs.of(cfg, "echo", plans["echo"], str(tiny_model), "train", "eval", str(out),
                         needs={"sft": str(tiny_model)})
    assert inp.module == __name__  # resolved on the driver: a Ray worker need not have the kind registered
    seen: list[dict] = []
    result = run_stage(inp, seen.append)
    assert result["greeting"] == "hello" and result["needs"] == {"sft": str(tiny_model)}
    assert (out / "model" / "config.json").is_file() and seen == [{"stage": "echo", "step": 0}]
    assert sys.modules[__name__].run is run  # the registry's module entry is what ran


def test_built_in_kinds_are_registry_entries_too():
    assert list(STAGE_KINDS) == ["pt", "sft", "rm", "dpo", "orpo", "simpo", "kto", "grpo", "rloo", "opd", "eval"]
    assert {k: (v.data_kind, v.default_from, v.memory_kind) for k, v in STAGE_KINDS.items()} == {
        "pt": ("pretrain", None, "pt"), "sft": ("sft", "pt", "sft"), "rm": ("preference", "sft", "rm"),
        "dpo": ("preference", "sft", "dpo"), "orpo": ("preference", "sft", "orpo"),
        "simpo": ("preference", "sft", "orpo"), "kto": ("unpaired", "sft", "kto"),
        "grpo": ("prompt", "sft", "grpo"), "rloo": ("prompt", "sft", "grpo"), "opd": ("sft", None, "opd"),
        "eval": ("sft", "sft", "sft")}
    # eval trains nothing (one Ray task, no model of its own) and reads the prompt, exam and pretraining data too.
    assert [k for k, v in STAGE_KINDS.items() if not v.trains] == ["eval"]
    assert STAGE_KINDS["eval"].reads == ("prompt", "exam", "pretrain")
    # The reference-free kinds are there but off unless a config enables them.
    assert make().enabled_stages() == ["pt", "sft", "rm", "dpo"]
    assert make(orpo={"enabled": True}).enabled_stages()[-1] == "orpo"
    with pytest.raises(ValueError, match="unknown stage kind 'ppo'"):
        make(ppo={})
    # grpo's reward_model reward reads the rm stage: `needs` rm, a disabled rm is an error naming the key.
    assert make(grpo={"enabled": True, "reward_funcs": ["reward_model"]}).depends_on("grpo") == ["sft", "rm"]
    with pytest.raises(ValueError, match="stages.grpo.needs: stage 'rm' is disabled"):
        make(grpo={"enabled": True, "reward_funcs": ["reward_model"]}, rm={"enabled": False})
    # rloo is always rewarded by the rm stage's model: it needs rm with no `needs` given.
    assert make(rloo={"enabled": True}).depends_on("rloo") == ["sft", "rm"]
    with pytest.raises(ValueError, match="stages.rloo.needs: stage 'rm' is disabled"):
        make(rloo={"enabled": True}, rm={"enabled": False})


def test_from_round_trips_through_the_resolved_config():
    from medgpt_ray.config import resolved_dict

    cfg = make(dpo={"from": "pt", "beta": 0.3})
    tree = resolved_dict(cfg)
    assert tree["stages"]["dpo"]["from"] == "pt"  # as the YAML says it (what a Tune trial re-validates)
    again = PipelineConfig.model_validate(tree)
    assert again == cfg and dag.effective_from(again, "dpo") == "pt"


def test_what_the_layers_above_ask_of_a_kind_is_on_its_entry():
    """run/, stages/, tune/, report/ and cli/ ask a kind's entry these facts instead of comparing its name
    (tests/unit/test_kind_names.py keeps the names out)."""
    from medgpt_ray.config import reward_model_kind, run_evaluator
    from medgpt_ray.memory.profiles import stage_profile

    def having(fact: str) -> list[str]:
        return [k for k, v in STAGE_KINDS.items() if getattr(v, fact)]

    assert reward_model_kind() == "rm" and having("produces_reward_model") == having("sequence_classifier") == ["rm"]
    assert run_evaluator() == "eval" and having("evaluates_run") == ["eval"]
    assert having("generates_outside_autocast") == ["grpo", "rloo"]
    # Each kind's length profile measures the unit of the data it trains on; pretraining's blocks are not measured.
    unit = {"pretrain": "blocks", "sft": "conversations", "preference": "pairs", "prompt": "prompts",
            "unpaired": "completions"}
    for name, kind in STAGE_KINDS.items():
        assert kind.measures == unit[kind.data_kind], name
        assert (kind.measures == "blocks") == stage_profile(name).blocks, name


def test_the_reward_model_kind_is_one():
    from medgpt_ray.config import reward_model_kind

    rm = STAGE_KINDS["rm"]
    register_stage_kind(StageKind("rm2", rm.config_class, "preference", "sft", produces_reward_model=True))
    try:
        with pytest.raises(ConfigError, match="2 reward-model kinds"):
            reward_model_kind()
    finally:
        del STAGE_KINDS["rm2"]
