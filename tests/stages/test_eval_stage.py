"""The eval stage in a plain process (no Ray) on real tiny models, with known answers (issue 19 item 2): a model
judged against itself ties on every prompt (win rate 0.5 inside its interval), and a tiny model trained on the sample
exam's answers scores >= 0.9 on them by log-likelihood."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from medgpt_ray.config import EvalStageConfig, StageConfig
from medgpt_ray.data.exam import answer_text, exam_prompt
from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.memory.planner import plan_stage
from medgpt_ray.stages import run_stage
from medgpt_ray.stages.inputs import StageInputs

EXAM = "data/sample/exam"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/stages/conftest.py


@pytest.fixture(scope="module")
def data(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval-data")
    return {"sft": prepare_kind("sft", [str(repo / "data/sample/sft_sharegpt.jsonl")], out, 0.1, max_records=32),
            "exam": prepare_kind("exam", [str(repo / EXAM)], out, 0.1)}


@pytest.fixture(scope="module")
def reward_model(tiny_model, tmp_path_factory) -> Path:
    """A sequence-classification model on the tiny base (its score head untrained): a judge that gives different
    answers different scores and the same answer the same score."""
    from medgpt_ray import models

    out = tmp_path_factory.mktemp("rm")
    tok = models.load_tokenizer(tiny_model)
    models.load_reward_model(tiny_model, "fp32", "full", tok.pad_token_id).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def eval_inputs(data, model: Path, out: Path, needs: dict[str, str], **keys) -> StageInputs:
    cfg = EvalStageConfig(**{"seq_len": 256, "max_prompts": 8, "max_new_tokens": 16, "bootstrap": 500, **keys})
    d = data["sft"]
    return StageInputs("eval", cfg, plan_stage("eval", cfg, 1, False), str(model), "chatml", d.train_file,
                       d.eval_file, str(out), needs=needs,
                       data_files={"exam": [data["exam"].train_file, data["exam"].eval_file]})


def test_scores_read_only_the_labelled_tokens_as_a_full_forward_does(tiny_model):
    import torch

    from medgpt_ray import models
    from medgpt_ray.kinds.eval.scores import sequence_logprobs

    model = models.load_causal_lm(tiny_model, "fp32", "full").eval()
    rows = [([5, 6, 7, 8, 9], [-100, -100, 7, 8, 9]), ([5, 6, 7], [-100, 6, 7]),
            ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])]
    expected = []
    for ids, labels in rows:  # one unpadded sequence at a time, the full logits
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        target = torch.tensor(labels[1:])
        keep = target != -100
        expected.append((logp[keep].gather(-1, target[keep, None]).sum().item(), int(keep.sum())))
    got = sequence_logprobs(model, rows, pad_id=0, batch_size=2, chunk_tokens=3)  # padded batches, chunked head
    assert [n for _, n in got] == [n for _, n in expected]
    assert [s for s, _ in got] == pytest.approx([s for s, _ in expected], abs=1e-4)


def test_a_model_judged_against_itself_ties_on_every_prompt(data, tiny_model, reward_model, tmp_path):
    r = run_stage(eval_inputs(data, tiny_model, tmp_path, {"dpo": str(tiny_model), "rm": str(reward_model)}))
    ev = r["evaluation"]
    assert ev["reference"] == "base" and list(ev["models"]) == ["base", "dpo"]
    w = ev["win_rates"]["dpo"]
    assert (w["prompts"], w["ties"], w["wins"], w["losses"]) == (8, 8, 0, 0)
    assert w["ci95"][0] <= 0.5 <= w["ci95"][1] and w["win_rate"] == 0.5
    base, dpo = ev["models"]["base"], ev["models"]["dpo"]
    assert base == {**dpo, "answers": {**dpo["answers"], "generate_seconds": base["answers"]["generate_seconds"]}}
    assert base["heldout"]["tokens"] > 0 and base["heldout"]["perplexity"] > 1
    assert base["decode_path"] == "dynamic (auto: on the CPU a compiled decode step saves nothing)"  # and why
    assert base["exam"]["questions"] == ev["data"]["exam_questions"] == 52
    assert r["output_model"] == str(tmp_path)
    assert json.loads((tmp_path / "results.json").read_text()) == ev
    items = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert len(items) == 16 and {i["model"] for i in items} == {"base", "dpo"}
    for name in ("generations.jsonl", "exam.jsonl"):  # answers are medical text: owner-only
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_a_model_trained_on_the_exam_answers_passes_it_by_log_likelihood(repo, data, tiny_model, tmp_path):
    records = load_canonical([repo / EXAM / "medical_mc.jsonl"], "exam").records
    qa = tmp_path / "exam_qa.jsonl"
    qa.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": exam_prompt(r)},
                                                        {"role": "assistant", "content": answer_text(r)}]},
                                     ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    split = prepare_kind("sft", [str(qa)], tmp_path / "data", 0.02)
    cfg = StageConfig(method="full", lr=2e-2, max_steps=100, seq_len=256, effective_batch=8, warmup_ratio=0.0,
                      logging_steps=50, save_steps=1000)
    trained = run_stage(StageInputs("sft", cfg, plan_stage("sft", cfg, 1, False), str(tiny_model), "chatml",
                                    split.train_file, split.eval_file, str(tmp_path / "sft")))
    exam = prepare_kind("exam", [str(repo / EXAM / "medical_mc.jsonl")], tmp_path / "exam", 0.1)
    inp = eval_inputs({**data, "exam": exam}, Path(trained["output_model"]), tmp_path / "eval", {}, max_prompts=1)
    ev = run_stage(inp)["evaluation"]
    assert ev["reference"] == "sft" and ev["judge"] is None and ev["win_rates"] == {}
    exam_result = ev["models"]["sft"]["exam"]
    assert exam_result["questions"] == len(records) == 48
    assert exam_result["loglik_accuracy"] >= 0.9, exam_result
    untrained = run_stage(eval_inputs({**data, "exam": exam}, tiny_model, tmp_path / "eval0", {}, max_prompts=1))
    assert untrained["evaluation"]["models"]["base"]["exam"]["loglik_accuracy"] < 0.5
