"""A second host on this machine: a network namespace of its own, joined to this one by a
veth pair, with addresses from 198.18.0.0/15 (the benchmarking range, routed nowhere).

Nodes that "join from another network" run in it (``ip netns exec``): they reach this
machine only at its veth address, never at 127.0.0.1, and cutting the link (the
namespace's interface set down) loses them as a pulled cable would. Needs root (CAP_NET_ADMIN),
as the CI machine has.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.run(
        [*prefix, "ip", *args], check=check, capture_output=True, text=True, timeout=30
    )


@dataclass(frozen=True)
class Overlay:
    """This machine at ``host_ip``; the namespace ``ns`` at ``node_ip`` (a /24 of its own)."""

    ns: str
    host_if: str
    node_if: str
    host_ip: str
    node_ip: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside the namespace."""
        return ["ip", "netns", "exec", self.ns, *args]

    def cut(self) -> None:
        """The namespace's interface goes down: nothing passes either way."""
        _ip("link", "set", self.node_if, "down", ns=self.ns)

    def mend(self) -> None:
        _ip("link", "set", self.node_if, "up", ns=self.ns)

    def pids(self) -> list[int]:
        """The processes running in the namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.ns], capture_output=True, text=True, check=True
        )
        return [int(p) for p in out.stdout.split()]


def _remove_stale() -> None:
    """Namespaces an earlier test run left behind when it was killed (its pid is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("et-") and name[3:].isdigit():
            pid = int(name[3:])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 0)
                continue
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            subprocess.run(["ip", "link", "del", f"etv{pid}"], capture_output=True)


@contextlib.contextmanager
def overlay() -> Iterator[Overlay]:
    """One namespace and its veth link for this test run (named by its pid, so two runs on
    one machine do not collide; so is its /24)."""
    _remove_stale()
    pid = os.getpid()
    subnet = f"198.{18 + (pid >> 8) % 2}.{pid % 256}"
    net = Overlay(f"et-{pid}", f"etv{pid}"[:15], f"etn{pid}"[:15], f"{subnet}.1", f"{subnet}.2")
    subprocess.run(["ip", "netns", "add", net.ns], check=True, capture_output=True)
    try:
        _ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.node_if)
        _ip("link", "set", net.node_if, "netns", net.ns)
        _ip("addr", "add", f"{net.host_ip}/24", "dev", net.host_if)
        _ip("link", "set", net.host_if, "up")
        _ip("addr", "add", f"{net.node_ip}/24", "dev", net.node_if, ns=net.ns)
        _ip("link", "set", net.node_if, "up", ns=net.ns)
        _ip("link", "set", "lo", "up", ns=net.ns)
        yield net
    finally:
        for pid_in in net.pids() if _exists(net.ns) else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid_in, 9)
        subprocess.run(["ip", "netns", "del", net.ns], capture_output=True)
        _ip("link", "del", net.host_if, check=False)


def _exists(ns: str) -> bool:
    return ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
