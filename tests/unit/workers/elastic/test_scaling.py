"""LayoutScalingPolicy: Ray's elastic decisions, rounded to sizes the layout can use."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from ray.train import ScalingConfig

from tests.support.recording import RecordingReporter
from workers.elastic.decisions import Noop, Resize
from workers.elastic.scaling import LayoutScalingPolicy, resize_message, usable_workers
from workers.ray_compat import NoopDecision, ResizeDecision


class OfflinePolicy(LayoutScalingPolicy):
    """The real policy with the cluster's reserved resources supplied by the test."""

    cpus_per_node: Sequence[float] = ()

    def _maybe_send_resource_request(self):
        pass

    def _get_reserved_resources(self):
        return {f"node{i}": {"CPU": c} for i, c in enumerate(self.cpus_per_node)}


def policy(*, unit: int, lo: int, hi: int) -> OfflinePolicy:
    p = OfflinePolicy(
        ScalingConfig(
            num_workers=(lo, hi),
            resources_per_worker={"CPU": 1},
            elastic_resize_monitor_interval_s=0,
        ),
        unit=unit,
        job_id="j",
    )
    p.reports._reporter = RecordingReporter()
    return p


def running(n: int):
    return SimpleNamespace(num_workers=n, start_time=0.0)


@pytest.mark.parametrize(
    "possible, unit, hi, expected",
    [(5, 1, 8, 5), (5, 2, 8, 4), (7, 4, 8, 4), (9, 4, 8, 8), (3, 4, 8, 0), (16, 2, 6, 6)],
)
def test_usable_workers_is_the_largest_multiple_of_the_layout(possible, unit, hi, expected):
    assert usable_workers(possible, unit=unit, max_workers=hi) == expected


def test_resize_messages_name_the_cause():
    assert resize_message(2, 3) == "resized 2 → 3 (node added)"
    assert resize_message(3, 2) == "resized 3 → 2 (node lost)"


def test_a_pipeline_job_grows_only_by_whole_dp_replicas_and_says_why():
    p = policy(unit=2, lo=2, hi=8)
    p.cpus_per_node = [2]
    assert p.make_decision_for_non_running_worker_group().num_workers == 2
    p.cpus_per_node = [2, 1]  # a 1-CPU node joins: 3 workers could run, 3 is not usable
    assert isinstance(p.make_decision_for_running_worker_group(running(2), None), NoopDecision)
    p.cpus_per_node = [2, 1, 1]
    assert p.make_decision_for_running_worker_group(running(2), None).num_workers == 4
    kinds = [(k, m) for k, m, _ in p.reports._reporter.kinds()]
    assert kinds[0][0] == "layout_unused" and "3 workers could run; using 2" in kinds[0][1]
    assert kinds[1] == ("resized", "resized 2 → 4 (node added)")


def test_a_lost_node_restarts_smaller_and_a_wait_below_min_is_reported_once():
    p = policy(unit=1, lo=2, hi=4)
    p.cpus_per_node = [2, 2]
    assert p.make_decision_for_non_running_worker_group().num_workers == 4
    p.cpus_per_node = [1]  # the group failed; one CPU is left, below min
    for _ in range(3):
        assert isinstance(p.make_decision_for_non_running_worker_group(), NoopDecision)
    p.cpus_per_node = [2]
    decision = p.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
    kinds = [(k, m) for k, m, _ in p.reports._reporter.kinds()]
    assert [k for k, _ in kinds] == ["waiting", "resized"]
    assert kinds[1][1] == "resized 4 → 2 (node lost)"


def test_the_policy_pickles_without_its_reporter():
    p = policy(unit=2, lo=2, hi=4)
    clone = pickle.loads(pickle.dumps(p))
    assert clone.reports._reporter is None and clone.unit == 2 and clone.job_id == "j"


def test_a_rerun_cancels_the_reservation_its_predecessor_left(tmp_path, monkeypatch):
    import workers.elastic.callbacks as callbacks

    cancelled = []
    monkeypatch.setattr(callbacks, "cancel_reservation", cancelled.append)
    marker = tmp_path / "job" / "ray_reservation"
    callback = callbacks.ReleaseStaleReservation(f"file://{marker}")
    callback.after_controller_start(SimpleNamespace(run_id="aaa"))  # first run: nothing to cancel
    assert cancelled == [] and marker.read_text() == "train-aaa"
    callback.after_controller_start(SimpleNamespace(run_id="aaa"))  # same run restarting
    assert cancelled == []
    pickle.loads(pickle.dumps(callback)).after_controller_start(SimpleNamespace(run_id="bbb"))
    assert cancelled == ["train-aaa"] and marker.read_text() == "train-bbb"


class _Remote:
    """Ray's coordinator actor class called in-process: ``handle.method.remote(...)``."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.target, name))


def test_a_restart_is_sized_from_live_nodes_not_the_coordinators_stale_view(monkeypatch):
    """Ray's coordinator re-reads the node list every 20 s; a restart must not wait for that."""
    import ray
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
    )

    nodes = [
        {"NodeID": n, "Alive": True, "Resources": {"CPU": 2.0}, "Labels": {}} for n in ("a", "b")
    ]
    coordinator = _AutoscalingCoordinatorActor(
        get_cluster_nodes=lambda: [dict(n) for n in nodes],
        send_resources_request=lambda *args, **kwargs: None,
    )
    coordinator.request_resources(
        requester_id="train-r", resources=[{"CPU": 1}] * 4, expire_after_s=600
    )
    nodes[1]["Alive"] = False  # node b dies between two of the coordinator's ticks
    assert len(coordinator.get_reserved_resources("train-r")) == 2  # still both nodes

    p = LayoutScalingPolicy(
        ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 1}), unit=1, job_id="j"
    )
    p.reports._reporter = RecordingReporter()
    p._requester_id = "train-r"
    p._coordinator_client = SimpleNamespace(
        _autoscaling_coordinator=_Remote(coordinator),
        maybe_send_resource_request=lambda *args: None,
    )
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    asked = []
    recorded = coordinator.get_reserved_resources
    monkeypatch.setattr(
        coordinator,
        "get_reserved_resources",
        lambda *a, **k: asked.append(k.get("recompute", False)) or recorded(*a, **k),
    )
    decision = p.make_decision_for_non_running_worker_group()
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 2
    assert asked == [True]  # one recomputed view, which the decision then read
    # A running group keeps Ray's cached view (no recompute on every poll).
    p._latest_reserved_resources_query_time = float("-inf")
    p.make_decision_for_running_worker_group(SimpleNamespace(num_workers=2, start_time=0.0), None)
    assert asked == [True, False]


def test_decisions_carry_what_they_say_and_only_the_callback_says_it(capsys):
    p = policy(unit=2, lo=2, hi=8)
    p.cpus_per_node = [2, 1]  # 3 could run, 2 are usable
    decision = p.decide_for_non_running_group()
    assert isinstance(decision, Resize) and decision.num_workers == 2
    (notice,) = decision.notices
    assert notice.kind == "layout_unused" and "3 workers could run; using 2" in notice.message
    assert p.reports._reporter.kinds() == []  # deciding reports nothing
    line = "etrain: node n1's warm spares ready 0.5 s after it joined: resizing"
    said = Noop(notices=decision.notices, log_lines=(line,))
    assert p.reports.report(said) is said
    assert capsys.readouterr().err == line + "\n"
    assert [k for k, _, _ in p.reports._reporter.kinds()] == ["layout_unused"]
