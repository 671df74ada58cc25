"""The report's figures, drawn with matplotlib (Agg, no display) and returned as base64 PNG data URIs, so the
HTML file needs nothing but itself. Each function takes plain data (report/rundata.py) and returns None when
there is nothing to draw; the caller says why instead."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from medgpt_ray.report.rundata import StageData, SweepData, stage_depths  # noqa: E402

STATUS_COLORS = {"done": "#a5d6a7", "skipped": "#dcedc8", "failed": "#ef9a9a", "interrupted": "#ffcc80",
                 "pending": "#e0e0e0", "not-run": "#eeeeee", "disabled": "#fafafa"}
BLUE, ORANGE, GREY, RED = "#1f77b4", "#ff7f0e", "#616161", "#c62828"


def to_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _panels(n: int, width: float = 4.2, height: float = 2.8) -> tuple[Figure, Sequence[Any]]:
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float) and "step" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def loss_lr(stage: StageData) -> str | None:
    """Training loss (and held-out loss where evaluated) and the learning rate, by optimizer step."""
    train = stage.train_records
    if not train:
        return None
    fig, (ax_loss, ax_lr) = _panels(2)
    ax_loss.plot(*_series(train, "loss"), color=BLUE, marker=".", label="train loss")
    steps, ev = _series(stage.eval_records, "eval_loss")
    if ev:
        ax_loss.plot(steps, ev, color=ORANGE, marker="o", linestyle="--", label="held-out loss")
    ax_loss.set(title=f"{stage.name}: loss", xlabel="step")
    ax_loss.legend(fontsize=8)
    ax_lr.plot(*_series(train, "learning_rate"), color=GREY)
    ax_lr.set(title=f"{stage.name}: learning rate", xlabel="step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    fig.tight_layout()
    return to_data_uri(fig)


def step_times(train: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Seconds per optimizer step between consecutive logged steps (time_s restarts on a resumed attempt)."""
    steps, secs = [], []
    for prev, cur in zip(train, train[1:], strict=False):
        dstep, dt = cur.get("step", 0) - prev.get("step", 0), cur.get("time_s", 0) - prev.get("time_s", 0)
        if dstep > 0 and dt > 0:
            steps.append(cur["step"])
            secs.append(dt / dstep)
    return steps, secs


def speed(stage: StageData) -> str | None:
    """Tokens per second (the whole job's) and seconds per optimizer step."""
    train = stage.train_records
    steps, tps = _series(train, "tokens_per_s")
    if not tps:
        return None
    fig, (ax_tps, ax_step) = _panels(2)
    ax_tps.plot(steps, tps, color=BLUE, marker=".")
    ax_tps.set(title=f"{stage.name}: tokens/s (all workers)", xlabel="step")
    s_steps, secs = step_times(train)
    ax_step.plot(s_steps, secs, color=GREY, marker=".")
    ax_step.set(title=f"{stage.name}: seconds per step", xlabel="step")
    fig.tight_layout()
    return to_data_uri(fig)


def gpu_memory(stage: StageData) -> str | None:
    """Rank 0's peak allocated GPU memory over the steps, against the predicted peak and the budget."""
    steps, peaks = _series(stage.metrics, "gpu_peak_gib")
    if not peaks:
        return None
    fig, (ax,) = _panels(1, width=6)
    ax.plot(steps, peaks, color=BLUE, marker=".", label="measured peak (rank 0)")
    pred = (stage.plan or {}).get("prediction") or {}
    if pred.get("peak_gib") is not None:
        ax.axhline(pred["peak_gib"], color=ORANGE, linestyle="--", label="predicted peak")
    if pred.get("budget_gib") is not None:
        ax.axhline(pred["budget_gib"], color=RED, label="budget")
    ax.set(title=f"{stage.name}: GPU memory (GiB)", xlabel="step", ylim=(0, None))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return to_data_uri(fig)


def plan_memory(stage: StageData) -> str | None:
    """The chosen configuration's predicted peak beside the rejected alternatives' and the measured peak, with
    the budget as a line."""
    plan = stage.plan or {}
    pred = plan.get("prediction") or {}
    if pred.get("peak_gib") is None:
        return None
    bars = [("chosen (predicted)", pred["peak_gib"], BLUE)]
    if stage.measured_peak_gib is not None:
        bars.append(("chosen (measured)", stage.measured_peak_gib, "#0d47a1"))
    for i, alt in enumerate(plan.get("alternatives") or [], 1):
        if alt.get("peak_gib") is not None:
            label = (f"alt {i}: {alt.get('method', '')} mb {alt.get('micro_batch', '?')}, ckpt "
                     f"{alt.get('ckpt_fraction', '?')}, ZeRO {alt.get('zero_stage', '?')}")
            bars.append((label, alt["peak_gib"], GREY))
    fig, (ax,) = _panels(1, width=6, height=0.45 * len(bars) + 1.2)
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    ax.invert_yaxis()
    if pred.get("budget_gib") is not None:
        ax.axvline(pred["budget_gib"], color=RED, label=f"budget {pred['budget_gib']:.2f} GiB")
        ax.legend(fontsize=8, loc="lower right")
    where = "per GPU" if plan.get("use_gpu", True) else "on the CPU (planned as a GPU would be)"
    ax.set(title=f"{stage.name}: peak memory {where} (GiB)", xlabel="GiB")
    fig.tight_layout()
    return to_data_uri(fig)


def stage_graph(stages: list[StageData]) -> str | None:
    """The stage graph: one box per stage in its wave's column, coloured by state, with its wall time."""
    if not stages:
        return None
    depth = stage_depths(stages)
    columns: dict[int, list[str]] = {}
    for s in stages:
        columns.setdefault(depth[s.name], []).append(s.name)
    pos = {name: (d, -i) for d, names in columns.items() for i, name in enumerate(names)}
    rows = max(len(v) for v in columns.values())
    fig, (ax,) = _panels(1, width=2.2 * len(columns) + 1, height=0.9 * rows + 0.8)
    for s in stages:
        for up in s.after:
            if up in pos:
                ax.annotate("", xy=pos[s.name], xytext=pos[up],
                            arrowprops={"arrowstyle": "->", "color": GREY, "shrinkA": 28, "shrinkB": 28})
    for s in stages:
        x, y = pos[s.name]
        wall = f"\n{s.wall_s:.0f} s" if isinstance(s.wall_s, int | float) else ""
        ax.text(x, y, f"{s.name}\n{s.status}{wall}", ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.5", "fc": STATUS_COLORS.get(s.status, "#ffffff"), "ec": GREY})
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_ylim(-rows + 0.4, 0.6)
    ax.axis("off")
    return to_data_uri(fig)


def bars(title: str, labels: list[str], series: dict[str, list[float]], horizontal: bool = False) -> str | None:
    """Grouped bars: one group per label, one bar per series (e.g. records in and out per operator)."""
    if not labels or not series:
        return None
    fig, (ax,) = _panels(1, width=6.5, height=max(2.6, 0.35 * len(labels) + 1.2) if horizontal else 3.0)
    width = 0.8 / len(series)
    colors = [BLUE, ORANGE, GREY, RED]
    for i, (name, values) in enumerate(series.items()):
        offsets = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        draw: Callable[..., Any] = ax.barh if horizontal else ax.bar
        draw(offsets, values, width, label=name, color=colors[i % len(colors)])
    if horizontal:
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
    else:
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return to_data_uri(fig)


def win_rate_figure(title: str, labels: list[str], rates: list[float],
                    cis: list[tuple[float, float]]) -> Figure | None:
    """Each model's win rate as a point with its bootstrap CI as an error bar, against the 0.5 line (no better, no
    worse than the reference): a bound is not a quantity of its own, so it is not a bar."""
    if not labels:
        return None
    fig, (ax,) = _panels(1, width=max(4.0, 1.2 * len(labels) + 2.5), height=3.0)
    xs = list(range(len(labels)))
    below = [max(r - lo, 0.0) for r, (lo, _) in zip(rates, cis, strict=True)]
    above = [max(hi - r, 0.0) for r, (_, hi) in zip(rates, cis, strict=True)]
    ax.errorbar(xs, rates, yerr=[below, above], fmt="o", color=BLUE, ecolor=BLUE, capsize=6, markersize=7,
                label="win rate, bootstrap 95% CI")
    ax.axhline(0.5, color=GREY, linestyle="--", linewidth=1, label="0.5: no better, no worse")
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set(title=title, ylabel="win rate", ylim=(0, 1), xlim=(-0.6, len(labels) - 0.4))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def win_rates(title: str, labels: list[str], rates: list[float], cis: list[tuple[float, float]]) -> str | None:
    fig = win_rate_figure(title, labels, rates, cis)
    return None if fig is None else to_data_uri(fig)


def sweep_params(sweep: SweepData) -> str | None:
    """The sweep's metric against each searched parameter; trials pruned before launch are marked at the top
    (they have no metric), stopped ones hollow."""
    params = sorted({k for r in sweep.rows for k, v in (r.get("params") or {}).items()
                     if isinstance(v, int | float) and not isinstance(v, bool)})
    if not params or sweep.metric is None:
        return None
    values = [r.get(sweep.metric) for r in sweep.rows if isinstance(r.get(sweep.metric), int | float)]
    top = max(values) * 1.05 if values else 1.0
    fig, axes = _panels(len(params), width=3.4)
    for ax, p in zip(axes, params, strict=True):
        for status, style, label in (("done", {"marker": "o", "color": BLUE}, "finished"),
                                     ("stopped", {"marker": "o", "facecolors": "none", "edgecolors": BLUE},
                                      "stopped early"),
                                     ("pruned", {"marker": "x", "color": RED}, "pruned (over budget)")):
            rows = [r for r in sweep.rows if r.get("status") == status and p in (r.get("params") or {})]
            xs = [r["params"][p] for r in rows]
            ys = [top if status == "pruned" else r.get(sweep.metric) for r in rows]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if isinstance(y, int | float)]
            if pts:
                ax.scatter([q[0] for q in pts], [q[1] for q in pts], label=label, **style)
        if p in ("lr",) or p.endswith(".lr"):
            ax.set_xscale("log")
        ax.set(xlabel=p, ylabel=sweep.metric)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{sweep.name}: {sweep.metric} by parameter")
    fig.tight_layout()
    return to_data_uri(fig)
