"""The dashboard and alert rules only use metrics the code exports, and Prometheus accepts the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from medgpt_ray.metrics import DEFINITIONS, exported_names

NAME = re.compile(r"\bray_medgpt_[a-z_]+")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's prometheus package (.ci/run and `make test` do)")
    return path


def test_dashboard_queries_exported_metrics_only(repo):
    dash = json.loads((repo / "cluster/grafana/medgpt-ray.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v.get("query", "") for v in dash["templating"]["list"] if isinstance(v.get("query"), str)]
    used = {m for e in exprs for m in NAME.findall(e)}
    assert used and used <= exported_names(), sorted(used - exported_names())
    assert {v["name"] for v in dash["templating"]["list"]} >= {"run", "stage"}
    # Every panel the issue asks for is there.
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for word in ("loss", "tokens/s", "memory vs budget", "temperature", "funnel", "timeline", "reward per function",
                 "generations/s"):
        assert word in titles
    # The stage variable offers the stages the metrics carry, as the run variable offers the runs: a new kind needs
    # no dashboard change.
    stage = next(v for v in dash["templating"]["list"] if v["name"] == "stage")
    assert stage["type"] == "query" and stage["query"] == 'label_values({__name__=~"ray_medgpt_.*"}, stage)'


def test_alert_rules_use_exported_metrics_and_load_in_promtool(repo):
    rules = yaml.safe_load((repo / "cluster/alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in NAME.findall(e)}
    assert used <= exported_names(), sorted(used - exported_names())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert names == {"MedgptGpuHot", "MedgptGpuThrottled", "MedgptLossNotFinite", "MedgptMemoryNearBudget",
                     "MedgptNoProgress", "MedgptStageFailed"}
    out = subprocess.run([_promtool(), "check", "rules", str(repo / "cluster/alerts.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 6 rules found" in out.stdout + out.stderr


def test_prometheus_config_is_valid(repo):
    out = subprocess.run([_promtool(), "check", "config", str(repo / "cluster/prometheus.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_metric_definitions_are_unique_and_tagged():
    names = [d.name for d in DEFINITIONS]
    assert len(names) == len(set(names))
    train = [d for d in DEFINITIONS if d.name.startswith(("medgpt_train_", "medgpt_gpu_"))]
    assert all(d.tags == ("run", "stage", "rank", "node", "gpu") for d in train)
