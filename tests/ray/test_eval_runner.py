"""The eval stage through the runner on local Ray (issue 19 item 2): a kind that trains nothing runs as one Ray task
(run/stage_runner.run_task_on_ray) on the shared tiny run's SFT model, judged by a reward model; its results reach
summary.json's fields, the summary's lines and the Prometheus gauges."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from medgpt_ray.config import EvalStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.run import eval_report
from medgpt_ray.run.stage_runner import RayOptions, run_task_on_ray
from medgpt_ray.stages.inputs import StageInputs


@dataclass
class Outcome:  # what the pipeline hands eval_report: a stage's status and result
    status: str
    result: dict


def test_the_eval_stage_runs_as_one_ray_task_on_a_finished_run(tiny_run, tiny_model, repo, tmp_path):
    from medgpt_ray import models
    from medgpt_ray.metrics import metrics

    sft_model = tiny_run.run_dir / "sft" / "model"
    rm = tmp_path / "rm"  # a judge on the tiny base, its score head untrained
    tok = models.load_tokenizer(tiny_model)
    models.load_reward_model(tiny_model, "fp32", "full", tok.pad_token_id).save_pretrained(rm)
    tok.save_pretrained(rm)
    exam = prepare_kind("exam", [str(repo / "data/sample/exam/ceval_style.jsonl")], tmp_path / "data", 0.25)
    cfg = EvalStageConfig(seq_len=256, max_prompts=4, max_new_tokens=8, max_examples=8, bootstrap=200)
    data = tiny_run.run_dir / "data"
    out = tmp_path / "eval"
    inp = StageInputs("eval", cfg, plan_stage("eval", cfg, 1, False), str(sft_model), "chatml",
                      str(data / "sft.train.parquet"), str(data / "sft.eval.parquet"), str(out),
                      needs={"dpo": str(sft_model), "rm": str(rm)},
                      data_files={"exam": [exam.train_file, exam.eval_file]})
    result = run_task_on_ray(inp, RayOptions(str(tmp_path / "_ray"), "eval-runner-test"))
    assert result == json.loads((out / "result.json").read_text())
    ev = result["evaluation"]
    assert ev["reference"] == "sft" and ev["data"]["prompts"] == 4 and ev["data"]["exam_questions"] == 4
    assert ev["win_rates"]["dpo"]["ties"] == 4 and ev["win_rates"]["dpo"]["ci95"][0] <= 0.5
    assert result["workers"][0]["device"] == "cpu"
    assert Path(result["output_model"]) == out

    fields = eval_report.summary_fields(Outcome("done", result))
    assert fields == {"eval": ev}
    skipped = eval_report.summary_fields(Outcome("skipped", {"result": result, "fingerprint": "x"}))
    assert skipped == fields  # a finished eval stage's numbers stay in the summary when it is skipped
    lines = eval_report.format_eval_lines(fields)
    assert lines[-1].startswith("win rate dpo over sft: 0.500 [0.500, 0.500] 95% CI (0 wins, 4 ties, 0 losses")
    eval_report.publish("evaltest", result)
    m = metrics()
    assert m.backend == "ray"  # the driver's gauges, as the pipeline sets them after the stage
