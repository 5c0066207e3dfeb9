"""deploy/grafana: every query names a metric that etrain or Ray really exports."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from service.api.prometheus import REGISTRY

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "etrain-dashboard.json"
METRIC = re.compile(r"\b((?:etrain|ray)_[a-z0-9_]+)\b(?!\s*[=~!])")
LABELS = {"ray_train_run_name", "ray_train_controller_state"}


def _etrain_metrics() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names |= {family.name} | {sample.name for sample in family.samples}
        if family.type == "counter":  # a labelled counter has no samples until first used
            names.add(f"{family.name}_total")
    return names


def _ray_metrics() -> set[str]:
    """Ray Train's metric names (prefixed ``ray_`` on export) and the node metrics used."""
    root = Path(importlib.util.find_spec("ray").origin).parent
    source = "".join(
        (root / "train/v2/_internal/metrics" / f).read_text()
        for f in ("controller.py", "worker.py")
    )
    train = {f"ray_{n}" for n in re.findall(r'= "(train_[a-z_]+)"', source)}
    panels = (root / "dashboard/modules/metrics/dashboards").glob("*.py")
    node = set(re.findall(r"\b(ray_[a-z_]+)\{", "".join(p.read_text() for p in panels)))
    return train | node


def _queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    variables = [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return [t["expr"] for panel in dash["panels"] for t in panel["targets"]] + variables


def test_every_query_uses_exported_metrics():
    known = _etrain_metrics() | _ray_metrics()
    used = {m for q in _queries() for m in METRIC.findall(q)} - LABELS
    assert used, "no metrics found in the dashboard"
    assert used - known == set()


def test_dashboard_covers_the_promised_signals():
    text = " ".join(_queries())
    for needle in (
        'etrain_jobs{status="QUEUED"}',
        "ray_train_report_total_blocked_time_s",
        '"RESTARTING"',
        '"RESIZING"',
        'ray_resources{Name="GPU",State="USED"}',
        "etrain_telemetry_points_total",
    ):
        assert needle in text


def test_dashboard_has_per_job_panels_for_every_per_job_metric():
    dash = json.loads(DASHBOARD.read_text())
    per_job = {
        n for n in _etrain_metrics() if n.startswith("etrain_job_") and not n.endswith("_created")
    } - {"etrain_job_restarts", "etrain_job_resizes"}
    text = " ".join(_queries())
    assert per_job == {
        "etrain_job_step",
        "etrain_job_step_time_seconds",
        "etrain_job_samples_per_second",
        "etrain_job_tokens_per_second",
        "etrain_job_world_size",
        "etrain_job_loss",
        "etrain_job_eval_loss",
        "etrain_job_eval_perplexity",
        "etrain_job_rewards_accuracy",
        "etrain_job_rewards_margin",
        "etrain_job_restarts_total",
        "etrain_job_resizes_total",
        "etrain_job_checkpoint_blocking_seconds",
    }
    assert {m for m in per_job if m not in text} == set()
    assert 'job_id=~"$job_id"' in text
    assert "job_id" in {v["name"] for v in dash["templating"]["list"]}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_a_misspelt_metric_would_be_caught():
    known = _etrain_metrics() | _ray_metrics()
    assert "etrain_job_submitted_total" not in known
    assert "etrain_job_restart_total" not in known
    assert "ray_train_report_blocked_time_s" not in known
