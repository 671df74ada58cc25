"""What the pipeline's driver prints: a progress line every few steps per stage, a line per finished stage, the
run's summary table."""

from __future__ import annotations

from typing import Any

from medgpt_ray.progress import progress_line


class ProgressPrinter:
    """Prints one line every `every` steps per stage (and the first and last), never raw worker bars."""

    def __init__(self, every: int, echo=print):
        self.every = every
        self.echo = echo
        self._last_printed: dict[str, int] = {}

    def feed(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if "loss" not in rec:
                continue
            stage, step = rec.get("stage", "?"), int(rec.get("step", 0))
            last = self._last_printed.get(stage)
            if last is None or step - last >= self.every or step == rec.get("total_steps"):
                self._last_printed[stage] = step
                self.echo(progress_line(rec))


def result_brief(r: dict[str, Any]) -> str:
    parts = [f"{r.get('steps')} steps"]
    if r.get("train_loss_first") is not None:
        parts.append(f"loss {r['train_loss_first']:.3f} -> {r['train_loss_last']:.3f}")
    parts += [f"{k} {v:.3f}" for k, v in r.get("eval", {}).items() if isinstance(v, float)]
    return ", ".join(parts)


def format_summary(summary: dict[str, Any]) -> str:
    head = f"{'stage':<6}{'status':<10}{'steps':>6}{'wall s':>9}  {'loss first -> last':<20}  eval"
    lines = [f"summary of run '{summary['name']}' ({summary['wall_s']:.0f}s)", head, "-" * len(head)]
    for s, st in summary["stages"].items():
        loss = (f"{st['train_loss_first']:.3f} -> {st['train_loss_last']:.3f}"
                if st.get("train_loss_first") is not None else "")
        ev = ", ".join(f"{k.removeprefix('eval_')}={v:.3f}" for k, v in (st.get("eval") or {}).items()
                       if isinstance(v, float))
        wall = f"{st['wall_s']:.1f}" if isinstance(st.get("wall_s"), float | int) else ""
        lines.append(f"{s:<6}{st['status']:<10}{st.get('steps') or '':>6}{wall:>9}  {loss:<20}  {ev}")
    lines.append(f"run directory: {summary['run_dir']}  (summary.json, manifest.json, <stage>/plan.json)")
    return "\n".join(lines)
