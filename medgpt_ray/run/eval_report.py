"""The eval stage's results where a run reports: summary.json's `eval` (keyed by the name of the stage that
evaluates the run, config.run_evaluator), the lines under the summary table, and the Prometheus gauges (metrics.py
defines them)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.config import run_evaluator
from medgpt_ray.metrics import metrics


def _evaluation(result: dict[str, Any]) -> dict[str, Any] | None:
    r = result.get("result", result)  # a manifest entry (skipped stage) nests the stage's result
    return r.get("evaluation")


def summary_fields(outcome: Any) -> dict[str, Any]:
    """summary.json's `eval`: the eval stage's results.json (this run's, or the finished one's); {} without one."""
    if outcome is None or outcome.status not in ("done", "skipped", "not-run"):
        return {}
    found = _evaluation(outcome.result or {})
    evaluator = run_evaluator()
    return {evaluator: found} if found and evaluator else {}


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_eval_lines(summary: dict[str, Any]) -> list[str]:
    """The eval section under the summary table: one line per model, one per decode path (the models on it and
    why), then one per win rate."""
    evaluator = run_evaluator()
    ev = summary.get(evaluator) if evaluator else None
    if not ev:
        return []
    head = f"{'model':<6}{'loss':>8}{'ppl':>9}{'reward':>9}{'tokens':>8}{'exam ll':>9}{'exam gen':>10}"
    lines = [f"eval (held-out: {ev['data']['heldout_conversations']} conversations, {ev['data']['prompts']} prompts, "
             f"{ev['data']['exam_questions']} exam questions; judge: {ev['judge'] or 'none (no rm stage)'})", head]
    for name, m in ev["models"].items():
        ans, exam = m.get("answers", {}), m.get("exam", {})
        lines.append(f"{name:<6}{_num(m['heldout']['loss']):>8}{_num(m['heldout']['perplexity'], 2):>9}"
                     f"{_num(ans.get('mean_reward')):>9}{_num(ans.get('mean_new_tokens'), 1):>8}"
                     f"{_num(exam.get('loglik_accuracy')):>9}{_num(exam.get('generated_accuracy')):>10}")
    by_path: dict[str, list[str]] = {}
    for name, m in ev["models"].items():
        if m.get("decode_path"):
            by_path.setdefault(m["decode_path"], []).append(name)
    lines += [f"decode path of {', '.join(names)}: {path}" for path, names in by_path.items()]
    lines.append("(loss, ppl: held-out conversations; reward: the rm judge's mean score of the answers; tokens: mean "
                 "answer length; exam ll: exam accuracy by the options' log-likelihood; exam gen: by the generated "
                 "answer's option letter)")
    for name, w in ev["win_rates"].items():
        lines.append(f"win rate {name} over {ev['reference']}: {_num(w['win_rate'])} "
                     f"[{_num(w['ci95'][0])}, {_num(w['ci95'][1])}] 95% CI ({w['wins']} wins, {w['ties']} ties, "
                     f"{w['losses']} losses of {w['prompts']})")
    return lines


def publish(run: str, result: dict[str, Any]) -> None:
    """The eval stage's numbers as gauges, from the driver (a finished task's gauges would vanish)."""
    ev = _evaluation(result)
    if not ev:
        return
    m = metrics()
    for name, values in ev["models"].items():
        tags = {"run": run, "model": name}
        if values["heldout"]["loss"] is not None:
            m.set("medgpt_eval_heldout_loss", values["heldout"]["loss"], tags)
        if values.get("answers", {}).get("mean_reward") is not None:
            m.set("medgpt_eval_mean_reward", values["answers"]["mean_reward"], tags)
        if values.get("answers"):
            m.set("medgpt_eval_response_tokens", values["answers"]["mean_new_tokens"], tags)
        for method in ("loglik", "generated"):
            acc = values.get("exam", {}).get(f"{method}_accuracy")
            if acc is not None:
                m.set("medgpt_eval_exam_accuracy", acc, {**tags, "method": method})
    for name, w in ev["win_rates"].items():
        if w["win_rate"] is not None:
            tags = {"run": run, "model": name, "reference": ev["reference"]}
            m.set("medgpt_eval_win_rate", w["win_rate"], tags)
            m.set("medgpt_eval_win_rate_low", w["ci95"][0], tags)
            m.set("medgpt_eval_win_rate_high", w["ci95"][1], tags)
