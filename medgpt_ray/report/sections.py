"""The report's sections, from a RunData: the run and its stage graph, the data (preparation and cleaning
funnel), a Tune sweep, and one section per stage (plan, curves, speed, GPU memory, held-out results). A piece
that is missing gets a note saying so ("not run", "CPU run"), never an empty space."""

from __future__ import annotations

from typing import Any

from medgpt_ray.report import plots
from medgpt_ray.report.devices import budget_cell, device_rows
from medgpt_ray.report.html import esc, figure, fmt, kv_table, note, section, status_badge, table
from medgpt_ray.report.rundata import RunData, StageData, SweepData
from medgpt_ray.stages.outputs import HELD_OUT

RAN = ("done", "skipped", "failed", "interrupted")
PLAN_KEYS = ("method", "precision", "num_workers", "micro_batch", "grad_accum", "ckpt_fraction", "fused_ce",
             "fused_kernels", "compile", "zero_stage", "offload", "optim", "packing")
ALT_KEYS = ("method", "micro_batch", "grad_accum", "ckpt_fraction", "fused_ce", "zero_stage", "offload", "peak_gib",
            "relative_speed", "why")


def active(run: RunData) -> list[StageData]:
    """The stages the config enables (a disabled one is named once, in the run section)."""
    return [s for s in run.stages if s.status != "disabled"]


def run_section(run: RunData) -> str:
    rows = []
    for s in active(run):
        r = s.summary
        loss = (f"{r['train_loss_first']:.3f} → {r['train_loss_last']:.3f}"
                if isinstance(r.get("train_loss_first"), int | float) else None)
        rows.append((s.name, s.status, r.get("steps"), s.wall_s, loss, fmt(r.get(HELD_OUT) or {}) or None,
                     r.get("error")))
    body = table(("stage", "state", "steps", "wall s", "loss first → last", "held-out", "error"), rows)
    disabled = [s.name for s in run.stages if s.status == "disabled"]
    if disabled:
        body += note(f"disabled in the config: {', '.join(disabled)}")
    info = run.run_info
    body += kv_table([("run directory", str(run.run_dir)), ("wall time (s)", run.wall_s),
                      ("git commit", info.get("git_commit")), ("driver host", info.get("driver_host")),
                      ("packages", info.get("packages"))])
    graph = section("stage-graph", "Stage graph",
                    figure(plots.stage_graph(active(run)), "stage graph", "no stages in this run") +
                    note("Each stage starts from the one left of it (and reads what it needs); colour is its "
                         "state, the number its wall time in this run."), level=3)
    return section("run", f"Run {run.name}", body + graph)


def _prepared(prepared: dict[str, Any] | None) -> str:
    if not prepared:
        return note("not recorded: this run prepared no data (every stage was already done), or it ran before "
                    "the report existed")
    kinds = list(prepared)
    rows = [(k, d.get("source_records"), d.get("train_records"), d.get("eval_records"), d.get("quarantined"),
             sum((d.get("redactions") or {}).values())) for k, d in prepared.items()]
    body = table(("kind", "source records", "train", "held out", "quarantined", "PII redactions"), rows)
    body += figure(plots.bars("records per data kind", kinds, {
        "train": [prepared[k].get("train_records", 0) for k in kinds],
        "held out": [prepared[k].get("eval_records", 0) for k in kinds],
        "quarantined": [prepared[k].get("quarantined", 0) for k in kinds]}), "records per data kind", "")
    reasons = [(k, reason, n) for k, d in prepared.items() for reason, n in (d.get("reasons") or {}).items()]
    redactions = [(k, t, n) for k, d in prepared.items() for t, n in (d.get("redactions") or {}).items() if n]
    body += "<h4>Quarantine reasons</h4>" + (table(("kind", "reason", "records"), reasons) or note("none"))
    body += "<h4>PII redactions by type</h4>" + (table(("kind", "type", "redactions"), redactions) or note("none"))
    not_read = [(k, why, n) for k, d in prepared.items() for why, n in (d.get("files_not_read") or {}).items()]
    body += "<h4>Files in data directories not read</h4>" + (table(("kind", "why", "files"), not_read) or note("none"))
    return body


def _cleaning(clean: dict[str, Any] | None) -> str:
    if not clean:
        return note("not run: this run's config has no data.raw, so no cleaning step (the data files were read "
                    "as given, see above)")
    ops = clean.get("operators") or {}
    body = kv_table([("source records", clean.get("source_records")), ("emitted", clean.get("emitted")),
                     ("quarantined", clean.get("quarantined")), ("adds up", clean.get("adds_up")),
                     ("wall s", clean.get("wall_s")), ("source records/s", clean.get("source_records_per_s")),
                     ("duplicate clusters", clean.get("duplicate_clusters"))])
    body += figure(plots.bars("records in and out per operator", list(ops), {
        "in": [o.get("in", 0) for o in ops.values()], "out": [o.get("out", 0) for o in ops.values()]}),
        "cleaning funnel", "no operators in the cleaning report")
    body += table(("operator", "in", "out", "other"), [
        (name, o.get("in"), o.get("out"), {k: v for k, v in o.items() if k not in ("in", "out")} or None)
        for name, o in ops.items()])
    reasons = clean.get("reasons") or {}
    body += "<h4>Quarantine reasons</h4>" + (table(("operator:reason", "records"), list(reasons.items())) or
                                             note("none"))
    body += figure(plots.bars("quarantined, by reason", list(reasons), {"records": list(reasons.values())},
                              horizontal=True), "quarantine reasons", "")
    red = clean.get("redactions") or {}
    body += "<h4>PII redactions by type</h4>" + (table(("type", "redactions"), list(red.items())) or note("none"))
    return body


def _overlong(run: RunData) -> str:
    """Per stage, its train records longer than seq_len: truncated and skipped by its `overlong` rule."""
    rows = [(s.name, o.get("unit"), o.get("records"), o.get("seq_len"), o.get("truncated"), o.get("skipped"),
             f"{100 * (o['truncated'] + o['skipped']) / o['records']:.1f} %" if o.get("records") else None,
             o.get("keep_99_seq_len"), o.get("policy"), o.get("rule"))
            for s in active(run) if (o := s.summary.get("overlong"))]
    body = table(("stage", "records of", "train records", "seq_len", "truncated", "skipped", "affected",
                  "seq_len keeping 99 % whole", "overlong", "rule"), rows)
    return body or note("none recorded: no stage of this run counted its records against seq_len (pt packs its "
                        "text into blocks)")


def data_section(run: RunData) -> str:
    body = section("data-prepared", "Prepared data (train / held-out split)", _prepared(run.prepared), level=3)
    body += section("data-overlong", "Records longer than seq_len", _overlong(run), level=3)
    body += section("cleaning", "Cleaning funnel (data.raw)", _cleaning(run.clean), level=3)
    return section("data", "Data", body)


def _sweep(sweep: SweepData) -> str:
    params = sorted({k for r in sweep.rows for k in (r.get("params") or {})})
    rows = [(r.get("trial"), r.get("status"), *[(r.get("params") or {}).get(p) for p in params],
             r.get(sweep.metric) if sweep.metric else None, r.get("predicted_peak_gib"), r.get("measured_peak_gib"),
             r.get("reason")) for r in sweep.rows]
    body = table(("trial", "status", *params, sweep.metric or "metric", "predicted peak GiB", "measured peak GiB",
                  "why pruned"), rows)
    best = sweep.best
    if best:
        body += note(f"best: trial {best.get('trial')} {sweep.metric} {fmt(best.get(sweep.metric))} with "
                     f"{fmt(best.get('params'))}")
    return body + figure(plots.sweep_params(sweep), f"{sweep.name} trials", "no numeric parameter to plot")


def sweep_section(run: RunData) -> str:
    if not run.sweeps:
        return section("sweep", "Tune sweep", note(f"not run: no sweep of this config beside the run "
                                                   f"({run.run_dir.name}-tune-<stage>/sweep_results.json)"))
    body = "".join(section(f"sweep-{s.name}", s.name, _sweep(s), level=3) for s in run.sweeps)
    return section("sweep", "Tune sweep", body)


def _plan(stage: StageData) -> str:
    plan = stage.plan
    if not plan:
        return note("no plan.json: the stage was not planned in this run directory")
    pred = plan.get("prediction") or {}
    clip = plan.get("reward_clip")
    body = kv_table([(k, plan.get(k)) for k in PLAN_KEYS] + [
        ("predicted peak GiB", pred.get("peak_gib")), ("budget GiB", budget_cell(plan)),
        ("measured peak GiB (rank 0)", stage.measured_peak_gib if stage.measured_peak_gib is not None else
         "not measured (no GPU)"), ("budget from", pred.get("budget_source")), *device_rows(stage),
        ("OOM back-offs", len(plan.get("backoffs") or []))] +
        ([("rewards clipped to", f"[{fmt(clip['min'])}, {fmt(clip['max'])}]: {clip['applied_to']}")] if clip else []))
    body += figure(plots.plan_memory(stage), f"{stage.name} memory plan", "no prediction in the plan")
    alts = plan.get("alternatives") or []
    body += "<h4>Alternatives not chosen</h4>" + (table(ALT_KEYS, [[a.get(k) for k in ALT_KEYS] for a in alts]) or
                                                  note("none: no other configuration was considered"))
    reasons = plan.get("reasons") or []
    if reasons:
        body += "<h4>Why</h4><ul>" + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ul>"
    return body


def _eval(stage: StageData) -> str:
    ev = (stage.result or {}).get(HELD_OUT) or stage.summary.get(HELD_OUT) or {}
    if not ev:
        return note("no held-out evaluation recorded for this stage")
    return table(("metric", "value"), list(ev.items()))


def stage_section(stage: StageData) -> str:
    head = f"<p>{status_badge(stage.status)} wall time {esc(fmt(stage.wall_s))} s</p>"
    if stage.status not in RAN:
        why = {"disabled": "disabled in the config", "passed-on": "max_steps 0: no training, its input model passed on"
               }.get(stage.status, "this run did not get to it")
        return section(f"stage-{stage.name}", f"Stage {stage.name}", head + note(f"not run: {why}"))
    if stage.summary.get("error"):
        head += note(f"error: {stage.summary['error']}")
    cpu = ("no GPU memory recorded: a CPU run has no GPU allocator" if stage.train_records else
           "no training step logged")
    body = head + section(f"plan-{stage.name}", "Plan", _plan(stage), level=3)
    body += section(f"curves-{stage.name}", "Loss and learning rate",
                    figure(plots.loss_lr(stage), f"{stage.name} loss", "no training step logged"), level=3)
    body += section(f"speed-{stage.name}", "Throughput",
                    figure(plots.speed(stage), f"{stage.name} speed", "no throughput logged"), level=3)
    body += section(f"gpu-{stage.name}", "GPU memory over time",
                    figure(plots.gpu_memory(stage), f"{stage.name} GPU memory", cpu), level=3)
    body += section(f"eval-{stage.name}", "Held-out results", _eval(stage), level=3)
    return section(f"stage-{stage.name}", f"Stage {stage.name}", body)
