"""The embedded Ray head: its token, its ports (free unless pinned) and its environment."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

import pytest

from service.backends.embedded import ensure_ray_token


def test_a_token_the_environment_names_is_kept(tmp_path, monkeypatch):
    given = tmp_path / "given"
    given.write_text("t0k3n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(given))
    assert ensure_ray_token(tmp_path / "data") == given
    assert not (tmp_path / "data" / "ray_auth_token").exists()


def test_without_one_a_private_token_file_is_created(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    path = ensure_ray_token(tmp_path / "data")
    assert path == tmp_path / "data" / "ray_auth_token"
    assert len(path.read_text()) == 64 and (path.stat().st_mode & 0o777) == 0o600
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path)


# -- ports: a second head on this machine must not collide with the first -----------------


def test_every_port_ray_opens_is_set_and_free_ones_are_chosen_per_start():
    from service.backends.ray_ports import RayPorts

    chosen = RayPorts().chosen()
    flags = dict(f.lstrip("-").split("=") for f in chosen.flags())
    assert set(flags) == {
        "port",
        "dashboard-port",
        "ray-client-server-port",
        "dashboard-agent-listen-port",  # Ray's default 52365 made a second head's jobs fail
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
        "node-manager-port",
        "object-manager-port",
        "min-worker-port",
        "max-worker-port",
    }
    # Those this process must know, or Ray only reads from its environment (the dashboard's
    # and autoscaler's Prometheus ports, 44227 and 44217 by default), are chosen here,
    # distinct; Ray binds the rest at 0.
    mine = [chosen.gcs, chosen.dashboard, chosen.client_server]
    mine += [chosen.dashboard_metrics, chosen.autoscaler_metrics]
    assert all(p > 1024 for p in mine) and len(set(mine)) == 5
    assert chosen.env() == {
        "DASHBOARD_METRIC_PORT": str(chosen.dashboard_metrics),
        "AUTOSCALER_METRIC_PORT": str(chosen.autoscaler_metrics),
    }
    assert flags["dashboard-agent-listen-port"] == "0" and flags["min-worker-port"] == "0"
    assert (
        RayPorts().chosen().gcs != chosen.gcs or RayPorts().chosen().dashboard != chosen.dashboard
    )


def test_ports_an_operator_pins_are_kept():
    from service.backends.factory import embedded_ports
    from service.settings import Settings

    pinned = Settings(ray_gcs_port=6400, ray_dashboard_port=8300, ray_dashboard_agent_port=52400)
    ports = embedded_ports(pinned.ray.embedded).chosen()
    assert (ports.gcs, ports.dashboard, ports.dashboard_agent_http) == (6400, 8300, 52400)
    assert "--dashboard-agent-listen-port=52400" in ports.flags()
    assert "--port=6400" not in ports.flags(head=False)


def test_a_head_other_machines_join_takes_the_join_ports_where_none_is_pinned():
    from service.backends.factory import embedded_ports
    from service.backends.node_join import join_hint, ray_start_args
    from service.backends.ray_ports import JOIN_PORTS
    from service.settings import Settings

    joinable = Settings(ray_node_ip="10.10.0.1", ray_gcs_port=6400)
    ports = embedded_ports(joinable.ray.embedded)
    assert ports.gcs == 6400 and ports.node_manager == JOIN_PORTS.node_manager == 6380
    assert not ports.auto  # nothing left to chance: a firewall can name them all
    assert (ports.min_worker, ports.max_worker) == (10002, 10201)
    # A node joins on the same documented ports, never the head's own three.
    args = ray_start_args("10.10.0.1:6400", num_gpus=2, gpu_memory_gb=24)
    assert "--node-manager-port=6380" in args and "--min-worker-port=10002" in args
    assert not [a for a in args if a.startswith(("--port=", "--dashboard-port="))]
    assert args[-2:] == ["--num-gpus=2", "--labels=etrain.io/gpu-memory-gb=24"]
    hint = join_hint("10.10.0.1:6400", Path("/srv/etrain/ray_auth_token"))
    assert "etrain node join --head 10.10.0.1:6400 --token-file <a copy of /srv/" in hint


def test_workers_on_other_nodes_report_to_the_heads_address():
    from service.settings import Settings

    assert Settings(host="0.0.0.0", port=8000).report_url == "http://127.0.0.1:8000"
    joinable = Settings(host="0.0.0.0", port=8000, ray_node_ip="10.10.0.1")
    assert joinable.report_url == "http://10.10.0.1:8000"
    public = Settings(ray_node_ip="10.10.0.1", public_url="https://etrain.lan/")
    assert public.report_url == "https://etrain.lan"


def test_defaults_leave_every_port_free():
    from service.settings import Settings

    s = Settings()
    assert all(
        getattr(s, f) == 0
        for f in type(s).model_fields
        if f.startswith("ray_") and f.endswith("_port")
    )


# -- environment: the head (and so every job) gets an allow-list, not the service's secrets -


def test_the_head_inherits_only_allow_listed_variables():
    from service.ray_head import head_env

    service_env = {
        "PATH": "/usr/bin",
        "HOME": "/home/svc",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": "/data/ray_auth_token",
        "ETRAIN_ADMIN_TOKEN": "et_admin",
        "ETRAIN_DATABASE_URL": "postgresql://u:pw@db/etrain",
        "ETRAIN_SECRET_TEAMA_SECRET_ACCESS_KEY": "a-key",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
        "OPERATOR_EXTRA": "kept-when-named",
    }
    got = head_env(service_env)
    assert sorted(got) == [
        "HOME",
        "LANG",
        "LC_ALL",
        "PATH",
        "PYTHONPATH",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN_PATH",
    ]
    assert head_env(service_env, ["OPERATOR_EXTRA"])["OPERATOR_EXTRA"] == "kept-when-named"


def test_a_head_that_exits_at_start_is_started_again_on_other_ports(tmp_path, monkeypatch):
    from service.backends import embedded

    class Exited:
        """A ``ray start`` that gave up at once (a chosen port was taken meanwhile)."""

        pid, returncode = 999_999_999, 1

        def poll(self):
            return 1

    class Second(Exception):
        pass

    starts: list[list[str]] = []

    def popen(cmd, **_):
        starts.append(cmd)
        if len(starts) == 1:
            return Exited()
        raise Second

    # Only the embedded module's view of subprocess: Ray's own imports keep the real one.
    fake = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    monkeypatch.setattr(embedded, "subprocess", fake)
    monkeypatch.setattr(embedded.os, "killpg", lambda *_: None)
    head = embedded.EmbeddedRay(data_dir=tmp_path, num_cpus=1)
    try:
        with pytest.raises(Second):
            head.start()
    finally:
        head.stop()
    first, second = ({f for f in cmd if f.startswith("--port=")} for cmd in starts)
    assert len(starts) == 2 and first != second
