"""bench/recovery.py's ``--split-cores``: each node's processes on cores of their own."""

from __future__ import annotations

import os

import pytest

from bench.recovery import core_halves, layout, pinned

CPUS = os.sched_getaffinity(0)


def test_the_halves_split_this_processs_cpus():
    if len(CPUS) < 2:
        with pytest.raises(SystemExit, match="at least 2 CPUs"):
            core_halves()
        return
    head, node = core_halves()
    assert head and node and not head & node
    assert head | node == CPUS


def test_pinned_runs_on_the_cpus_meanwhile_and_as_before_after():
    one = {min(CPUS)}
    with pinned(one):
        assert os.sched_getaffinity(0) == one  # what it starts now inherits this
    assert os.sched_getaffinity(0) == CPUS


def test_pinned_restores_the_cpus_when_the_block_raises():
    with pytest.raises(RuntimeError), pinned({min(CPUS)}):
        raise RuntimeError("the head did not start")
    assert os.sched_getaffinity(0) == CPUS


def test_none_leaves_the_affinity_as_it_was():
    with pinned(None):
        assert os.sched_getaffinity(0) == CPUS
    assert os.sched_getaffinity(0) == CPUS


def test_the_table_says_where_each_node_ran():
    assert layout(None, None) == "all shared by both nodes"  # without --split-cores
    assert layout({0}, {1}) == "head on CPUs [0], joining node on [1]"
