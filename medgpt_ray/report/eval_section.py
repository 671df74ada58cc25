"""The report's eval section: the eval stage's results.json (held-out loss per model, answers judged by the reward
model and the win rates over the reference, exam accuracy, per subject where the questions name theirs; each model's
decode path). Numbers only: the answers themselves stay in runs/<name>/eval/generations.jsonl (owner-only)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.config import STAGE_KINDS, run_evaluator
from medgpt_ray.report import plots
from medgpt_ray.report.html import figure, note, section, table


def anchor() -> str:
    """The section's id and its link in the report's navigation: the name of the stage that evaluates the run."""
    return run_evaluator() or "evaluation"


def _ordered(names: list[str]) -> list[str]:
    """Models in the stage graph's order (summary.json's keys are sorted), the base model first."""
    order = ["base", *STAGE_KINDS]
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))


def _models(ev: dict[str, Any]) -> str:
    rows = []
    for name in _ordered(list(ev["models"])):
        m = ev["models"][name]
        ans, exam, pt = m.get("answers", {}), m.get("exam", {}), m.get("pretrain_heldout") or {}
        rows.append((name, m["heldout"].get("loss"), m["heldout"].get("perplexity"), pt.get("perplexity"),
                     ans.get("mean_reward"), ans.get("mean_new_tokens"), exam.get("loglik_accuracy"),
                     exam.get("loglik_sum_accuracy"), exam.get("generated_accuracy")))
    return table(("model", "held-out loss (responses)", "perplexity", "pretraining text perplexity",
                  "mean reward", "mean answer tokens", "exam: log-likelihood (per token)", "exam: log-likelihood (sum)",
                  "exam: generated letter"), rows)


def _decode_paths(ev: dict[str, Any]) -> str:
    """How each model's answers decoded and why (results.json's models.<name>.decode_path), one note per path."""
    by_path: dict[str, list[str]] = {}
    for name in _ordered(list(ev["models"])):
        if ev["models"][name].get("decode_path"):
            by_path.setdefault(ev["models"][name]["decode_path"], []).append(name)
    return "".join(note(f"decode path of {', '.join(names)}: {path}") for path, names in by_path.items())


def _win_rates(ev: dict[str, Any]) -> str:
    wins = ev.get("win_rates") or {}
    if not wins:
        why = "no reward model (the rm stage is not in the run)" if not ev.get("judge") else "no aligned model"
        return note(f"no win rates: {why}")
    rows = [(name, wins[name]["win_rate"], f"[{wins[name]['ci95'][0]}, {wins[name]['ci95'][1]}]", wins[name]["wins"],
             wins[name]["ties"], wins[name]["losses"], wins[name]["prompts"]) for name in _ordered(list(wins))]
    body = table(("model", f"win rate over {ev['reference']}", "bootstrap 95% CI", "wins", "ties", "losses",
                  "prompts"), rows)
    names = _ordered(list(wins))
    body += figure(plots.win_rates(f"win rate over {ev['reference']}", names,
                                   [wins[n]["win_rate"] for n in names],
                                   [(wins[n]["ci95"][0], wins[n]["ci95"][1]) for n in names]),
                   "win rates: each model's win rate as a point, its bootstrap 95% CI as an error bar", "")
    return body


def _per_subject(ev: dict[str, Any]) -> str:
    """The exam's accuracy per subject (results.json's models.<name>.exam.per_subject): a row a subject, its
    questions, then each model's log-likelihood and generated-letter accuracy; "" when no question names one."""
    names = [n for n in _ordered(list(ev["models"])) if (ev["models"][n].get("exam") or {}).get("per_subject")]
    if not names:
        return ""
    subjects: dict[str, int] = {}
    for n in names:
        for subject, v in ev["models"][n]["exam"]["per_subject"].items():
            subjects.setdefault(subject, v["questions"])
    rows = []
    for subject, questions in subjects.items():
        cells: list[Any] = [subject, questions]
        for n in names:
            v = ev["models"][n]["exam"]["per_subject"].get(subject, {})
            cells += [v.get("loglik_accuracy"), v.get("generated_accuracy")]
        rows.append(cells)
    headers = ["subject", "questions",
               *(f"{n}: {how}" for n in names for how in ("log-likelihood", "generated letter"))]
    return section("eval-exam-subjects", "Exam accuracy by subject", table(headers, rows), level=3)


def eval_section(ev: dict[str, Any] | None) -> str:
    if not ev:
        return section(anchor(), "Evaluation", note("not run: no eval stage in this run (stages.eval.enabled)"))
    d = ev["data"]
    body = note(f"held-out: {d['heldout_conversations']} SFT conversations (loss), {d['prompts']} prompts answered "
                f"greedily by each model, {d['exam_questions']} exam questions (data.exam); judge: "
                f"{ev.get('judge') or 'none'}; reference: {ev['reference']}")
    body += _models(ev) + _decode_paths(ev) + section("eval-wins", "Win rates", _win_rates(ev), level=3)
    names = [n for n in _ordered(list(ev["models"])) if ev["models"][n].get("exam")]
    if names:
        body += figure(plots.bars("exam accuracy", names, {
            "log-likelihood": [ev["models"][n]["exam"]["loglik_accuracy"] for n in names],
            "generated letter": [ev["models"][n]["exam"]["generated_accuracy"] for n in names]}),
            "exam accuracy", "")
    body += _per_subject(ev)
    return section(anchor(), "Evaluation", body)
