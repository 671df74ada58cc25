"""Every rollout decodes with the KV cache, under gradient checkpointing and from a checkpoint whose config.json says
`use_cache: false` (issue 35 item 2). A forward pre-hook on the first decoder layer of a real tiny model records how
many positions each forward under no_grad computes: with the cache, a rollout is a prefill of the prompt and then one
new token a forward; without it, every new token re-runs the whole prefix (n, n + 1, n + 2, ...). Measured before
the fix: opd's student sampled cacheless under checkpointing (GKDTrainer's own choice), and grpo's rollouts and the
engine did from such a checkpoint (transformers derives the generation config from config.json)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.generation.engine import Generator
from medgpt_ray.kinds.opd.config import OPDStageConfig
from medgpt_ray.kinds.rloo.stage import rloo_args
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import build_stage
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.trainer_kit.checkpointing import decoder_layers
from tests.stages.test_grpo_stage import grpo_inputs, prompts  # noqa: F401  (the prompts fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py


@pytest.fixture(scope="module")
def trained_checkpoint(tiny_model, tmp_path_factory) -> Path:
    """The tiny model as transformers sees a checkpoint the Trainer wrote (config.json `use_cache: false`: 5.24's
    Trainer writes its argument's default False; older ones did under gradient checkpointing) that has no
    generation_config.json beside it: its generation config then comes from config.json."""
    out = tmp_path_factory.mktemp("checkpoint") / "model"
    shutil.copytree(tiny_model, out)
    (out / "generation_config.json").unlink()
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    return out


class ForwardWidths:
    """Positions computed by each forward of a model's first decoder layer without gradients (rollouts, and the
    log-prob passes TRL runs under no_grad), in order."""

    def __init__(self, model: Any):
        self.widths: list[int] = []
        decoder_layers(model)[0].register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not torch.is_grad_enabled():
            hidden = args[0] if args else kwargs["hidden_states"]
            self.widths.append(int(hidden.shape[1]))

    def prefix_reruns(self) -> int:
        """Forwards that computed the previous forward's positions plus one: a decode step without the cache."""
        return sum(b == a + 1 for a, b in zip(self.widths, self.widths[1:], strict=False) if a > 1)

    def assert_cached(self) -> None:
        assert 1 in self.widths and self.prefix_reruns() == 0, f"positions per forward: {self.widths}"


def test_grpo_rollouts_use_the_kv_cache_under_checkpointing(prompts, trained_checkpoint, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    inp = grpo_inputs(prompts, trained_checkpoint, tmp_path, grad_ckpt=True, max_steps=1, effective_batch=4,
                      max_completion_length=6, reward_funcs=["length"], beta=0.0)
    assert inp.plan.ckpt_fraction == 1.0
    trainer = build_stage(inp).trainer
    widths = ForwardWidths(trainer.model)
    trainer.train()
    widths.assert_cached()
    # RLOO's rollout is configured by the same keywords (stages/online_rl.py online_kwargs) and generates as GRPO.
    assert rloo_args(replace(inp, stage="rloo", cfg=_rloo_config(inp))).generation_kwargs == {"use_cache": True}


def _rloo_config(inp: StageInputs) -> Any:
    from medgpt_ray.config import RLOOStageConfig

    keys = ("method", "lora", "lr", "max_steps", "seq_len", "effective_batch", "num_generations",
            "max_completion_length", "grad_ckpt")
    return RLOOStageConfig(**{k: getattr(inp.cfg, k) for k in keys})


def test_the_opd_student_samples_with_the_kv_cache_under_checkpointing(repo, tiny_model, trained_checkpoint,
                                                                      tmp_path):
    torch.manual_seed(0)
    data = prepare_kind("sft", [str(repo / "data/sample/rl/department_sft.jsonl")], tmp_path / "sft", 0.2,
                        max_records=16)
    # lmbda 1: the student answers in every micro-batch; the teacher is a directory (a path with '/').
    cfg = OPDStageConfig(enabled=True, teacher=str(tiny_model), method="lora", lr=1e-3, max_steps=1, seq_len=128,
                         effective_batch=2, lmbda=1.0, max_new_tokens=6, warmup_ratio=0.0, save_steps=100,
                         logging_steps=1, grad_ckpt=True)
    inp = StageInputs("opd", cfg, plan_stage("opd", cfg, 1, False), str(trained_checkpoint), "chatml",
                      data.train_file, data.eval_file, str(tmp_path / "opd"))
    assert inp.plan.ckpt_fraction == 1.0
    trainer = build_stage(inp).trainer
    widths = ForwardWidths(trainer.model)  # the student's layers: the teacher is another model
    trainer.train()
    widths.assert_cached()


def test_the_engine_decodes_with_the_kv_cache(trained_checkpoint):
    gen = Generator(str(trained_checkpoint), "chatml", {"max_new_tokens": 6})
    widths = ForwardWidths(gen.model)
    gen({"prompt_id": ["p"], "conversations": [json.dumps([{"role": "user", "content": "Which department?"}])],
         "tools": ["[]"]})
    widths.assert_cached()
