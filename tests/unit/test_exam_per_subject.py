"""The exam's accuracy per subject (issue 48): the eval stage's summarise groups each model's per-question items by
the question's subject (those without one under "(none)"), counts the right answers per subject by log-likelihood
and by the generated letter, and leaves the block as it was when no question names a subject; the report renders
the per-subject table (escaped: subject names are the user's data)."""

from __future__ import annotations

from types import SimpleNamespace

from medgpt_ray.kinds.eval.stage import EvalData, ModelEval, summarise
from medgpt_ray.kinds.eval.stats import NO_SUBJECT, exam_summary


def item(qid: str, answer: str, loglik: str, generated: str, subject: str | None = None) -> dict:
    return {"id": qid, **({"subject": subject} if subject is not None else {}), "answer": answer, "loglik": loglik,
            "loglik_sum": answer, "generated": generated, "response": generated}


# 内科学: 3 questions, 2 right by log-likelihood, 1 by the letter; 外科学: 2 questions, 1 and 2; no subject: 1, 0 and 0.
ITEMS = [item("q1", "A", "A", "B", "内科学"), item("q2", "B", "B", "B", "内科学"), item("q3", "AC", "AB", "", "内科学"),
         item("q4", "C", "C", "C", "外科学"), item("q5", "D", "A", "D", "外科学"), item("q6", "A", "B", "C")]


def test_summarise_counts_the_right_answers_per_subject():
    data = EvalData(conversations=[], texts=[], prompts=[], exam=[(x["id"], {}) for x in ITEMS])
    evals = {"sft": ModelEval(loss={"loss": 2.0}, text_loss=None, exam=ITEMS),
             "dpo": ModelEval(loss={"loss": 2.1}, text_loss=None, exam=[{**x, "loglik": x["answer"]} for x in ITEMS])}
    results = summarise("sft", evals, {}, data, SimpleNamespace(cfg=SimpleNamespace(bootstrap=10), seed=0))
    exam = results["models"]["sft"]["exam"]
    assert (exam["questions"], exam["loglik_accuracy"], exam["generated_accuracy"], exam["unparsed"]) == \
        (6, 0.5, 0.5, 1)
    assert exam["per_subject"] == {
        "内科学": {"questions": 3, "loglik_accuracy": round(2 / 3, 4), "generated_accuracy": round(1 / 3, 4)},
        "外科学": {"questions": 2, "loglik_accuracy": 0.5, "generated_accuracy": 1.0},
        NO_SUBJECT: {"questions": 1, "loglik_accuracy": 0.0, "generated_accuracy": 0.0}}
    assert list(exam["per_subject"]) == ["内科学", "外科学", NO_SUBJECT]  # by name, the unnamed last
    dpo = results["models"]["dpo"]["exam"]["per_subject"]
    assert [v["loglik_accuracy"] for v in dpo.values()] == [1.0, 1.0, 1.0]
    assert sum(v["questions"] for v in dpo.values()) == results["data"]["exam_questions"] == 6


def test_without_any_subject_the_exam_block_is_as_before():
    plain = [{k: v for k, v in x.items() if k != "subject"} for x in ITEMS]
    assert set(exam_summary(plain)) == {"questions", "loglik_accuracy", "loglik_sum_accuracy", "generated_accuracy",
                                        "unparsed"}
    assert exam_summary(plain)["loglik_sum_accuracy"] == 1.0


def test_the_report_renders_the_per_subject_table():
    from medgpt_ray.report.eval_section import eval_section

    per = {"内科学": {"questions": 3, "loglik_accuracy": 0.6667, "generated_accuracy": 0.3333},
           "<b>外科</b>": {"questions": 2, "loglik_accuracy": 0.5, "generated_accuracy": 1.0}}
    exam = {"questions": 5, "loglik_accuracy": 0.6, "loglik_sum_accuracy": 0.6, "generated_accuracy": 0.6}
    ev = {"reference": "sft", "judge": None, "win_rates": {},
          "data": {"heldout_conversations": 4, "prompts": 4, "exam_questions": 5},
          "models": {"sft": {"heldout": {"loss": 2.0, "perplexity": 7.4}, "exam": {**exam, "per_subject": per}},
                     "dpo": {"heldout": {"loss": 2.1, "perplexity": 8.2},
                             "exam": {**exam, "per_subject": {k: {**v, "loglik_accuracy": 0.25}
                                                              for k, v in per.items()}}}}}
    html = eval_section(ev)
    assert 'id="eval-exam-subjects"' in html and "Exam accuracy by subject" in html
    table = html[html.index('id="eval-exam-subjects"'):]
    for header in ("subject", "questions", "sft: log-likelihood", "sft: generated letter", "dpo: log-likelihood"):
        assert f"<th>{header}</th>" in table
    assert "<td>内科学</td><td class=\"num\">3</td>" in table and "0.6667" in table and "0.25" in table
    assert "<b>外科</b>" not in html and "&lt;b&gt;外科&lt;/b&gt;" in table  # the user's names escaped
    for model in ev["models"].values():
        del model["exam"]["per_subject"]
    assert "eval-exam-subjects" not in eval_section(ev)  # no subjects: no table
