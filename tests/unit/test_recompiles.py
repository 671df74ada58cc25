"""The recompile count of compiled layers (stages/speed.py RecompileCount): a real torch.compile on CPU sees a new
input length after the first step and the count goes up; it lands in metrics.jsonl and in the run's summary table.

The compile uses dynamo's "eager" backend: the count is dynamo's (graphs captured and guarded), the same whatever
backend turns the graph into code, and inductor's C++ build of each graph would cost this 2-core machine seconds
per graph for nothing the test asserts."""

from __future__ import annotations

import json

import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from medgpt_ray.run.progress import format_summary, result_brief, summary_entry
from medgpt_ray.stages.callbacks import StageProgress
from medgpt_ray.stages.outputs import most_recompiles
from medgpt_ray.stages.speed import RecompileCount


class Block(torch.nn.Module):
    """A decoder layer's shape of work: norm, projection, activation, over [batch, length, hidden]."""

    def __init__(self):
        super().__init__()
        self.norm, self.proj = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.proj(self.norm(x))) + x


def test_a_new_length_after_the_first_step_counts_as_a_recompile_and_lands_in_metrics_jsonl(tmp_path):
    torch._dynamo.reset()
    block = Block()
    block.compile(backend="eager")
    watch = RecompileCount()
    progress = StageProgress("dpo", tmp_path / "metrics.jsonl", None, None, watch)
    args, control = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerControl()
    state = TrainerState()

    def step(length: int) -> None:
        block(torch.randn(2, length, 8)).sum().backward()
        state.global_step += 1
        watch.on_step_end(args, state, control)
        progress.on_log(args, state, control, logs={"loss": 1.0})

    assert watch.recompiles is None  # nothing to say before the first step
    step(128)  # the first step compiles the path: not a recompile
    assert watch.recompiles == 0 and watch.report()["compiled_graphs"] >= 1
    step(128)  # the same length: the graph is reused
    assert watch.recompiles == 0
    step(256)  # a new length: dynamo recompiles (the length becomes a dynamic dimension)
    after_new_length = watch.recompiles
    assert after_new_length >= 1
    step(384)  # the dynamic graph serves further lengths
    assert watch.recompiles == after_new_length
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["recompiles"] for r in rows] == [0, 0, after_new_length, after_new_length]
    watch.on_train_end(args, state, control)
    with torch.no_grad():  # the stage's final evaluation: a new path, compiled after training, stalls no step
        block(torch.randn(2, 128, 8))
    assert watch.recompiles > after_new_length and watch.report()["recompiles"] == after_new_length


def test_the_summary_shows_recompiles_only_for_compiled_stages():
    compiled = {"steps": 4, "train_loss_first": 1.0, "train_loss_last": 0.5, "eval": {}, "recompiles": 2}
    eager = {"steps": 4, "train_loss_first": 1.0, "train_loss_last": 0.5, "eval": {}}
    workers = [{"rank": 0, "compile": {"compiled_graphs": 3, "recompiles": 0}},
               {"rank": 1, "compile": {"compiled_graphs": 5, "recompiles": 2}}]
    assert most_recompiles(workers) == {"recompiles": 2} and most_recompiles([{"rank": 0}]) == {}
    assert "2 recompiles after step 1" in result_brief(compiled) and "recompiles" not in result_brief(eager)
    stages = {"rm": summary_entry("done", compiled, 3.0, None), "dpo": summary_entry("done", eager, 4.0, None)}
    both = {"name": "r", "run_dir": "/tmp/r", "wall_s": 9.0, "stages": stages}
    table = format_summary(both).splitlines()
    assert "recomp" in table[1] and table[3].split()[4] == "2"
    assert "recompiles" not in summary_entry("done", eager, 4.0, None)
    assert "recomp" not in format_summary({**both, "stages": {"dpo": both["stages"]["dpo"]}})


def test_the_summary_names_disabled_stages_in_one_line_not_a_row_each():
    """Issue 48 item 10: the summary listed six disabled stages, a row each."""
    ran = {"steps": 4, "train_loss_first": 1.0, "train_loss_last": 0.5, "eval": {}}
    stages = {"pt": summary_entry("disabled", {}, None, None), "sft": summary_entry("done", ran, 3.0, None),
              "orpo": summary_entry("disabled", {}, None, None), "rm": summary_entry("passed-on", {}, None, None),
              "kto": summary_entry("disabled", {}, None, None)}
    table = format_summary({"name": "r", "run_dir": "/tmp/r", "wall_s": 9.0, "stages": stages}).splitlines()
    assert [line.split()[0] for line in table[3:5]] == ["sft", "rm"]  # what ran or passed its model on
    assert not any(line.startswith(("pt ", "orpo ", "kto ")) for line in table)
    assert "not enabled: pt, orpo, kto (stages.<kind>.enabled: true runs one)" in table
    every = {"name": "r", "run_dir": "/tmp/r", "wall_s": 9.0, "stages": {"sft": stages["sft"]}}
    assert not any(line.startswith("not enabled") for line in format_summary(every).splitlines())
