"""Unit tests start no processes: anything that needs one (Ray, gloo groups, servers,
kustomize) belongs in tests/integration. This guard fails a unit test that tries."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest

MESSAGE = "unit tests start no processes; move this test to tests/integration"


def _refuse(*args, **kwargs):
    raise AssertionError(MESSAGE)


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    """Refuse subprocesses, forks and multiprocessing for the duration of each unit test."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
    monkeypatch.setattr(os, "posix_spawn", _refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
