"""NodeWatch: spares on a node that joins a running job (bounded), and a resize check at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.train import ScalingConfig

from tests.support.recording import RecordingReporter
from workers.contract import SPARES_WAIT_OVER
from workers.elastic import node_spares, scaling
from workers.elastic.node_spares import NodeWatch
from workers.ray_compat import NoopDecision, ResizeDecision


class Cluster:
    """The live nodes a watch sees, and the spares it asked each raylet for."""

    def __init__(self, monkeypatch, *, spares: bool = True):
        self.nodes: dict[str, dict] = {"head": {"CPU": 2.0}}
        self.asked: list[tuple[str, int, str]] = []
        self.ready: dict[str, int] = {}  # node id -> its spares recorded ready
        monkeypatch.setattr(node_spares, "POLL_S", 0.0)
        monkeypatch.setattr(node_spares.warm_spares, "ready_on", lambda n: self.ready.get(n, 0))
        monkeypatch.setattr(NodeWatch, "_alive_nodes", lambda _self: dict(self.nodes))
        monkeypatch.setattr(NodeWatch, "_worker_env", lambda _self: "ENV" if spares else "")
        monkeypatch.setattr(node_spares, "prestart_workers", self._prestart)

    def _prestart(self, count, *, keep_alive_s, runtime_env, node_id):
        assert keep_alive_s > 0
        self.asked.append((node_id, count, runtime_env))


def test_nodes_there_at_the_start_get_nothing_a_joined_one_its_share(monkeypatch):
    cluster = Cluster(monkeypatch)
    watch = NodeWatch(max_workers=4, cpus=1, gpus=0)
    assert watch.poll(2) == [] and cluster.asked == []  # the head: the driver's and top_up's
    cluster.nodes["n1"] = {"CPU": 8.0}
    assert watch.poll(2) == ["n1"]
    # 8 CPUs could hold 8 workers; the group can only add 2 (max 4, running 2).
    assert cluster.asked == [("n1", 2, "ENV")] and watch.pending == {"n1": 2}
    assert watch.joined_at is not None
    assert watch.poll(4) == [] and len(cluster.asked) == 1  # asked once per node


def test_spares_are_bounded_by_what_the_node_can_run(monkeypatch):
    cluster = Cluster(monkeypatch)
    watch = NodeWatch(max_workers=8, cpus=2, gpus=1)
    watch.poll(0)
    cluster.nodes["cpu-only"] = {"CPU": 16.0}  # no GPU: no worker of this job fits
    cluster.nodes["small"] = {"CPU": 3.0, "GPU": 4.0}  # one worker's 2 CPUs fit once
    cluster.nodes["big"] = {"CPU": 64.0, "GPU": 8.0}  # 8 fit; the group has room for 7
    assert sorted(watch.poll(0)) == ["big", "cpu-only", "small"]
    assert sorted((n, c) for n, c, _ in cluster.asked) == [("big", 7), ("small", 1)]


def test_a_node_the_list_briefly_dropped_is_not_joined_again(monkeypatch):
    cluster = Cluster(monkeypatch)
    watch = NodeWatch(max_workers=4, cpus=1, gpus=0)
    watch.poll(2)
    cluster.nodes["n1"] = {"CPU": 2.0}
    assert watch.poll(2) == ["n1"]
    gone = cluster.nodes.pop("n1")
    assert watch.poll(2) == []
    cluster.nodes["n1"] = gone
    assert watch.poll(2) == [] and cluster.asked == [("n1", 2, "ENV")]


def test_a_job_without_spares_asks_for_none_but_still_sees_the_join(monkeypatch):
    cluster = Cluster(monkeypatch, spares=False)
    watch = NodeWatch(max_workers=4, cpus=1, gpus=0)
    watch.poll(2)
    cluster.nodes["n1"] = {"CPU": 2.0}
    assert watch.poll(2) == ["n1"] and cluster.asked == [] and watch.joined_at is not None


def test_a_failing_raylet_or_node_list_is_only_logged(monkeypatch, caplog):
    cluster = Cluster(monkeypatch)
    watch = NodeWatch(max_workers=4, cpus=1, gpus=0)
    watch.poll(2)

    def refuse(*args, **kwargs):
        raise ConnectionError("raylet gone")

    monkeypatch.setattr(node_spares, "prestart_workers", refuse)
    cluster.nodes["n1"] = {"CPU": 2.0}
    assert watch.poll(2) == ["n1"] and watch.pending == {}
    monkeypatch.setattr(NodeWatch, "_alive_nodes", lambda _self: 1 / 0)
    assert watch.poll(2) == []
    assert "raylet gone" in caplog.text and "ZeroDivisionError" in caplog.text


class OfflinePolicy(scaling.LayoutScalingPolicy):
    """The real policy; the cluster's reserved resources come from the test."""

    cpus = (2.0,)
    views: list[bool]
    refreshed = False

    def _maybe_send_resource_request(self):
        pass

    def refresh_reservation(self):
        self.refreshed = True

    def _get_reserved_resources(self):
        self.views.append(self.refreshed)  # True: recomputed from live nodes
        self.refreshed = False
        return {f"node{i}": {"CPU": c} for i, c in enumerate(self.cpus)}


@pytest.mark.parametrize("monitor_s", [5.0, 3600.0])
def test_a_join_is_acted_on_without_waiting_for_the_resize_monitor(monkeypatch, monitor_s):
    cluster = Cluster(monkeypatch)
    p = OfflinePolicy(
        ScalingConfig(
            num_workers=(2, 4),
            resources_per_worker={"CPU": 1},
            elastic_resize_monitor_interval_s=monitor_s,
        ),
        unit=1,
        job_id="j",
    )
    p.reports._reporter, p.views = RecordingReporter(), []
    assert p.make_decision_for_non_running_worker_group().num_workers == 2
    group = SimpleNamespace(num_workers=2, start_time=float("-inf"))
    p.make_decision_for_running_worker_group(group, None)  # the monitor looked: nothing new
    p.make_decision_for_running_worker_group(group, None)  # too soon for the monitor
    assert p.views == [True, False]
    cluster.nodes["n1"] = {"CPU": 2.0}
    cluster.ready["n1"] = 2  # its spares at once (the wait for them: the tests below)
    # The node is listed before its resources are reserved: looked at again next iteration.
    assert isinstance(p.make_decision_for_running_worker_group(group, None), NoopDecision)
    assert cluster.asked == [("n1", 2, "ENV")]
    p.cpus = (2.0, 2.0)
    decision = p.make_decision_for_running_worker_group(group, None)
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 4
    assert p.views == [True, False, True, True]
    assert p.nodes.joined_at is None  # acted on: back to the resize monitor's pace


def _policy_with_a_joined_node(monkeypatch, cluster: Cluster):
    p = OfflinePolicy(
        ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 1}),
        unit=1,
        job_id="j",
    )
    p.reports._reporter, p.views = RecordingReporter(), []
    group = SimpleNamespace(num_workers=2, start_time=float("-inf"))
    p.make_decision_for_non_running_worker_group()
    p.make_decision_for_running_worker_group(group, None)
    cluster.nodes["n1"] = {"CPU": 2.0}
    p.cpus = (2.0, 2.0)
    return p, group


def test_a_grown_group_waits_for_the_joined_nodes_spares(monkeypatch, capsys):
    cluster = Cluster(monkeypatch)
    p, group = _policy_with_a_joined_node(monkeypatch, cluster)
    # The node's 2 spares still import: the running group keeps training, and Ray's
    # policy is not asked (it would log its resize decision on every iteration).
    views = len(p.views)
    assert isinstance(p.make_decision_for_running_worker_group(group, None), NoopDecision)
    cluster.ready["n1"] = 1
    assert isinstance(p.make_decision_for_running_worker_group(group, None), NoopDecision)
    assert p.nodes.warming() == {"n1": 1} and len(p.views) == views
    cluster.ready["n1"] = 2
    decision = p.make_decision_for_running_worker_group(group, None)
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 4
    assert p.nodes.pending == {} and p.nodes.warming() == {}
    err = capsys.readouterr().err
    assert err.count("resizing once its 2 warm spare(s) are ready") == 1
    assert err.count("node n1's warm spares ready") == 1
    said = SPARES_WAIT_OVER.search(err)  # as the tests and bench/recovery.py read it
    assert said and float(said.group(1)) < 1 and said.group(2) is None
    p.make_decision_for_running_worker_group(group, None)
    assert "warm spares" not in capsys.readouterr().err  # each said once


def test_the_wait_for_spares_is_bounded(monkeypatch, capsys):
    cluster = Cluster(monkeypatch)
    p, group = _policy_with_a_joined_node(monkeypatch, cluster)
    assert isinstance(p.make_decision_for_running_worker_group(group, None), NoopDecision)
    p.nodes.joined_at -= node_spares.SPARES_WAIT_S  # no spare ever became ready
    decision = p.make_decision_for_running_worker_group(group, None)
    assert isinstance(decision, ResizeDecision) and decision.num_workers == 4
    err = capsys.readouterr().err
    assert "node n1's warm spares not all ready after 20 s: resizing without" in err
    said = SPARES_WAIT_OVER.search(err)
    assert said and said.group(1) is None and float(said.group(2)) == node_spares.SPARES_WAIT_S


def test_no_wait_without_spares_or_when_a_count_fails(monkeypatch):
    cluster = Cluster(monkeypatch, spares=False)  # a job without warm spares asks for none
    p, group = _policy_with_a_joined_node(monkeypatch, cluster)
    assert isinstance(p.make_decision_for_running_worker_group(group, None), ResizeDecision)

    cluster = Cluster(monkeypatch)
    p, group = _policy_with_a_joined_node(monkeypatch, cluster)
    monkeypatch.setattr(node_spares.warm_spares, "ready_on", lambda n: 1 / 0)
    assert isinstance(p.make_decision_for_running_worker_group(group, None), ResizeDecision)


def test_a_restart_acts_on_the_join_too(monkeypatch, capsys):
    cluster = Cluster(monkeypatch)
    p, group = _policy_with_a_joined_node(monkeypatch, cluster)
    assert isinstance(p.make_decision_for_running_worker_group(group, None), NoopDecision)
    # A worker fails meanwhile: the restart is sized from every live node, the new one too.
    assert p.make_decision_for_non_running_worker_group().num_workers == 4
    assert p.nodes.pending == {} and p.nodes.joined_at is None
    p.make_decision_for_running_worker_group(SimpleNamespace(num_workers=4, start_time=0), None)
    err = capsys.readouterr().err
    assert "node n1's warm spares no longer waited for: the group restarted" in err
    assert not SPARES_WAIT_OVER.search(err)  # no resize ended that wait
