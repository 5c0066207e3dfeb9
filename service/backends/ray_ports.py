"""The ports of a Ray node etrain starts: the embedded head's, and a node that joins it.

A head that only this machine uses takes free ports. A head that other machines join
(``ETRAIN_RAY_NODE_IP``) and every ``etrain node join`` use :data:`JOIN_PORTS` instead, a
fixed set a firewall can name (``docs/nodes.md``); each ``ETRAIN_RAY_*_PORT`` set still wins.
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass

CHOSEN_HERE = ("gcs", "dashboard", "client_server", "dashboard_metrics", "autoscaler_metrics")


def free_port() -> int:
    """A TCP port no one listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RayPorts:
    """Every port the embedded head opens; 0 = a free one, chosen at each start.

    The GCS, dashboard and Ray client ports are chosen here (this process must know
    them), and so are the dashboard's and the autoscaler's Prometheus ports (set by
    environment, 44227 and 44217 by default, and recorded as given); the others are
    left to Ray, which binds port 0 and records what it got. Worker ports 0/0 mean
    each worker binds any free port.
    """

    gcs: int = 0
    dashboard: int = 0
    client_server: int = 0
    dashboard_agent_http: int = 0
    dashboard_agent_grpc: int = 0
    metrics_export: int = 0
    runtime_env_agent: int = 0
    node_manager: int = 0
    object_manager: int = 0
    min_worker: int = 0
    max_worker: int = 0
    dashboard_metrics: int = 0
    autoscaler_metrics: int = 0

    def chosen(self) -> RayPorts:
        """These ports with a free one for each of ``CHOSEN_HERE`` left at 0."""
        return dataclasses.replace(
            self, **{k: free_port() for k in CHOSEN_HERE if not getattr(self, k)}
        )

    @property
    def auto(self) -> bool:
        """Whether a start chooses any port (so a failed start may be retried with others)."""
        return not all(getattr(self, k) for k in CHOSEN_HERE)

    def env(self) -> dict[str, str]:
        """The variables that set the ports Ray takes from its environment."""
        return {
            "DASHBOARD_METRIC_PORT": str(self.dashboard_metrics),
            "AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics),
        }

    def flags(self, *, head: bool = True) -> list[str]:
        """The ``ray start`` flags for these ports (a node joining a head: not the head's
        GCS, dashboard and client server ports)."""
        names = {
            "gcs": "port",
            "dashboard": "dashboard-port",
            "client_server": "ray-client-server-port",
            "dashboard_agent_http": "dashboard-agent-listen-port",
            "dashboard_agent_grpc": "dashboard-agent-grpc-port",
            "metrics_export": "metrics-export-port",
            "runtime_env_agent": "runtime-env-agent-port",
            "node_manager": "node-manager-port",
            "object_manager": "object-manager-port",
            "min_worker": "min-worker-port",
            "max_worker": "max-worker-port",
        }
        if not head:
            names = {
                k: v for k, v in names.items() if k not in ("gcs", "dashboard", "client_server")
            }
        return [f"--{flag}={getattr(self, field)}" for field, flag in names.items()]


# Ray's own defaults where it has one (GCS 6379, dashboard 8265, client 10001, dashboard
# agent 52365, the Prometheus ports 44227 / 44217), and a block from 6380 for the ports Ray
# leaves to chance; 200 worker ports (one per worker process: ranks, warm spares, drivers).
JOIN_PORTS = RayPorts(
    gcs=6379,
    dashboard=8265,
    client_server=10001,
    node_manager=6380,
    object_manager=6381,
    runtime_env_agent=6382,
    dashboard_agent_grpc=6383,
    metrics_export=6384,
    dashboard_agent_http=52365,
    min_worker=10002,
    max_worker=10201,
    dashboard_metrics=44227,
    autoscaler_metrics=44217,
)


def joinable(ports: RayPorts) -> RayPorts:
    """``ports`` with each one left at 0 taken from :data:`JOIN_PORTS`."""
    return dataclasses.replace(
        ports,
        **{
            f.name: getattr(JOIN_PORTS, f.name)
            for f in dataclasses.fields(ports)
            if not getattr(ports, f.name)
        },
    )
