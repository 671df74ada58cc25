"""The eval stage on CMB-format exam questions (issue 48), in a plain process on the tiny model: each question's
subject reaches its exam.jsonl item, and results.json's exam block has its accuracy per subject, the counts adding
up to the model's own."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import EvalStageConfig
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py


def test_the_eval_stage_reports_exam_accuracy_per_subject(repo, tiny_model, tmp_path):
    sft = prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], tmp_path / "data", 0.1, max_records=8)
    exam = prepare_kind("exam", [str(repo / "data/sample/cmb")], tmp_path / "data", 0.25)
    cfg = EvalStageConfig(seq_len=256, max_prompts=1, max_examples=2, max_new_tokens=4, exam_max_new_tokens=4)
    inp = StageInputs("eval", cfg, plan_stage("eval", cfg, 1, False), str(tiny_model), "chatml", sft.train_file,
                      sft.eval_file, str(tmp_path / "eval"), needs={},
                      data_files={"exam": [exam.train_file, exam.eval_file]})
    result = run_stage(inp)
    block = result["evaluation"]["models"]["base"]["exam"]
    assert block["questions"] == 12
    per = block["per_subject"]
    assert {k: v["questions"] for k, v in per.items()} == {"临床执业医师": 4, "口腔执业医师": 4, "护士执业资格": 4}
    items = [json.loads(line) for line in (tmp_path / "eval" / "exam.jsonl").read_text(encoding="utf-8").splitlines()]
    for subject, v in per.items():  # each subject's accuracy is its own questions' share of right answers
        mine = [x for x in items if x["subject"] == subject]
        assert v["loglik_accuracy"] == round(sum(x["loglik"] == x["answer"] for x in mine) / len(mine), 4)
        assert v["generated_accuracy"] == round(sum(x["generated"] == x["answer"] for x in mine) / len(mine), 4)
    saved = json.loads((tmp_path / "eval" / "results.json").read_text(encoding="utf-8"))
    assert saved["models"]["base"]["exam"]["per_subject"] == per
