"""The static decode path in a rollout (generation/decode_path.py, trainer_kit/static_rollouts.py) on the tiny model
and CPU, forced by `generation_path: static`: greedy rollouts give the tokens of the dynamic path, TRL's regular
generation; two rollouts of different prompt lengths share ONE static cache (built once, reset in place) and, with
transformers' compilation forced onto the CPU (CompileConfig._compile_all_devices, dynamo's eager backend: the
guards without inductor's compile time), one compiled decode step: no recompilation. That CUDA graphs are captured
and replayed takes a GPU (bench/generation_throughput.py --paths merged-static)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from medgpt_ray.generation.decode_path import INPUT_GRAD_HOOK
from medgpt_ray.stages import build_stage
from tests.stages.test_grpo_stage import grpo_inputs, prompts  # noqa: F401  (the prompts fixture)
from tests.stages.test_static_generator import scramble

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py
PROMPTS = ([[11, 12, 13, 14, 15], [21, 22, 23]], [[31, 32, 33, 34, 35, 36, 37, 38, 39], [41, 42]])


def greedy_rollouts(trainer: Any) -> list[list[list[int]]]:
    """Completions of two GRPO rollouts (TRL's _generate_single_turn) of PROMPTS' two batches, greedy."""
    trainer.generation_config.do_sample = False
    trainer.generation_config.temperature = None
    return [trainer._generate_single_turn(batch, None, {}, 2)[0] for batch in PROMPTS]


def input_grad_hooks(model: Any) -> list[str]:
    """The names of transformers' requires_grad_ hooks on `model`'s input embeddings."""
    return [h.__name__ for h in model.get_input_embeddings()._forward_hooks.values()
            if getattr(h, "__name__", "") == INPUT_GRAD_HOOK]


def observe_input_grad_hooks(model: Any, monkeypatch: Any) -> list[list[str]]:
    """The hooks present at each of the static decode loop's calls from now on (generation/decode_loop.py, the
    call itself unchanged)."""
    from medgpt_ray.generation import decode_loop

    seen: list[list[str]] = []
    decode = decode_loop.decode

    def observed(*args: Any, **kwargs: Any) -> Any:
        seen.append(input_grad_hooks(model))
        return decode(*args, **kwargs)

    monkeypatch.setattr(decode_loop, "decode", observed)
    return seen


def test_a_static_rollout_decodes_as_the_dynamic_one_on_one_cache(prompts, tiny_model, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    keys = dict(max_completion_length=6, effective_batch=4, reward_funcs=["length"], beta=0.0)
    dynamic = build_stage(grpo_inputs(prompts, tiny_model, tmp_path / "dynamic", **keys))
    # Checkpointed, as a GPU plan usually is: PEFT then hooks requires_grad_ onto the input embeddings' output.
    static_inp = grpo_inputs(prompts, tiny_model, tmp_path / "static", generation_path="static", grad_ckpt=True,
                             **keys)
    assert static_inp.plan.generation_path == "static" and "decode: static" in static_inp.plan.rollout
    assert static_inp.plan.ckpt_fraction == 1.0
    assert dynamic.trainer.__class__.__name__.count("Static") == 0
    trainer = build_stage(static_inp).trainer
    for t in (trainer, dynamic.trainer):  # before the first rollout: the merge keeps a copy of the frozen base then
        scramble(t.model)
    decoder = trainer.static_decoder
    compile_eager = CompileConfig(backend="eager", mode=None)
    compile_eager._compile_all_devices = True  # transformers compiles the decode step on the CPU too
    decoder.compile_config = compile_eager
    hooks_during = observe_input_grad_hooks(trainer.model.get_base_model(), monkeypatch)
    torch._dynamo.reset()
    counters.clear()
    first = trainer._generate_single_turn(PROMPTS[0], None, {}, 2)  # sampled, compiled: one graph
    # torch 2.11 (the GPU image) breaks the graph at that hook's requires_grad_ (2.13 traces it): it is off while
    # the step decodes and back for the training forward.
    assert hooks_during == [[]] and input_grad_hooks(trainer.model.get_base_model()) == [INPUT_GRAD_HOOK]
    cache, graphs = decoder.cache, counters["stats"]["unique_graphs"]
    assert not counters["graph_break"], dict(counters["graph_break"])  # one whole graph for CUDA graphs to capture
    assert graphs == 1 and first[1] is None and len(first[0]) == 2
    greedy = greedy_rollouts(trainer)
    assert greedy == greedy_rollouts(dynamic.trainer)
    assert len({tuple(c) for rollout in greedy for c in rollout}) == 4  # four prompts, four completions
    assert decoder.builds == 1 and decoder.cache is cache
    # The cache as long as the plan priced it (the data's rows), not the stage's seq_len cap.
    assert decoder.max_len == static_inp.plan.train_setup(static_inp.cfg).seq_len
    assert counters["stats"]["unique_graphs"] == graphs  # prompts of 5 and 9 tokens: no recompilation
    stats = decoder.stats()
    assert stats.pop("generate_s") > 0
    assert stats == {"cache_builds": 1, "calls": 3, "graphs_compiled": 1, "cudagraph_skips": 0,
                     "attention": "packed_gqa", "loop": "medgpt"}  # TRL's config: our decode loop


def test_a_static_stage_run_reports_its_decoding_in_result_json(prompts, tiny_model, tmp_path):  # noqa: F811
    """Through run_stage (two optimizer steps, the held-out greedy rewards before and after on the merged adapter):
    every rollout decoded on the one static cache, and result.json says so (on the CPU nothing is compiled)."""
    import json

    from medgpt_ray.stages import run_stage

    keys = dict(max_completion_length=6, effective_batch=4, reward_funcs=["length"], beta=0.0)
    r = run_stage(grpo_inputs(prompts, tiny_model, tmp_path, generation_path="static", **keys))
    assert r["steps"] == 2 and r["eval"]["eval_prompts"] > 0
    assert r["decode"]["cache_builds"] == 1 and r["decode"]["calls"] == 2  # one generate call a step
    # Where a rollout's time goes: the generate calls, and merging the adapter and writing the base back.
    assert r["decode"]["generate_s"] > 0 and r["rollout_merge_s"] > 0
    assert json.loads((tmp_path / "result.json").read_text())["decode"] == r["decode"]


def test_the_opd_student_samples_on_the_static_path(repo, tiny_model, tmp_path):
    """GKD's own sampling function, handed the student behind the static decoder (trainer_kit/static_rollouts.py),
    through one real opd step on the merged adapter: the student's samples ran on the one static cache."""
    from medgpt_ray.data.prepare import prepare_kind
    from medgpt_ray.kinds.opd.config import OPDStageConfig
    from medgpt_ray.memory.planner import plan_stage
    from medgpt_ray.stages.inputs import StageInputs

    torch.manual_seed(0)
    data = prepare_kind("sft", [str(repo / "data/sample/rl/department_sft.jsonl")], tmp_path / "sft", 0.2,
                        max_records=16)
    cfg = OPDStageConfig(enabled=True, teacher=str(tiny_model), method="lora", lr=1e-3, max_steps=2, seq_len=128,
                         effective_batch=2, lmbda=1.0, max_new_tokens=6, warmup_ratio=0.0, save_steps=100,
                         logging_steps=1, generation_path="static")
    inp = StageInputs("opd", cfg, plan_stage("opd", cfg, 1, False), str(tiny_model), "chatml", data.train_file,
                      data.eval_file, str(tmp_path / "opd"))
    assert inp.plan.generation_path == "static" and inp.plan.rollout.startswith("merged")
    trainer = build_stage(inp).trainer
    trainer.train()
    decoder = trainer.static_decoder
    assert decoder.builds == 1 and decoder.cache is not None and decoder.max_len == 128
    assert decoder.loop == "medgpt"  # GKD's return_dict_in_generate call, on our decode loop
