"""A worker's collectives go over the interface of its Ray node's address."""

from __future__ import annotations

import os

import ray.util

from workers import collective_net


def test_the_interface_holding_an_address_is_found():
    assert collective_net.interface_of("127.0.0.1") == "lo"
    assert collective_net.interface_of("198.51.100.254") is None  # held by no interface here


def test_gloo_and_nccl_take_the_node_ips_interface_unless_set(monkeypatch):
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the operator's choice stays
    assert collective_net.pin_to_node_ip() == "lo"
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "ib0")


def test_an_address_no_interface_holds_changes_nothing(monkeypatch):
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "198.51.100.254")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert collective_net.pin_to_node_ip() is None
    assert "GLOO_SOCKET_IFNAME" not in os.environ
