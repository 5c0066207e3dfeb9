"""Which network interface a worker's collectives use: the one that carries its Ray node.

gloo (and NCCL's socket transport) pick an interface by resolving the host name, which on
a machine joined over an overlay (WireGuard, Tailscale: ``etrain node join``) names the
LAN address the other machines cannot reach, and in a network namespace may name one that
is not even there. Ray already knows the address the other nodes reach this one at (its
node IP, ``--node-ip-address``): the interface that holds it is the one to use. Set before
the worker's process group starts (the job's per-process setup hook); a
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` the operator set is kept.
"""

from __future__ import annotations

import os
import socket

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(ip: str) -> str | None:
    """The name of the interface that holds address ``ip``, if one here does."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family in (socket.AF_INET, socket.AF_INET6) and a.address == ip for a in addrs):
            return name
    return None


def pin_to_node_ip() -> str | None:
    """Point gloo and NCCL at the interface of this process's Ray node IP (unless set);
    return the interface, or None where none here holds that address."""
    import ray

    name = interface_of(ray.util.get_node_ip_address())
    if name is not None:
        for var in IFNAME_VARS:
            os.environ.setdefault(var, name)
    return name
