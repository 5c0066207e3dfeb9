"""The unit-test guard (tests/unit/conftest.py) really refuses processes."""

from __future__ import annotations

import multiprocessing
import subprocess

import pytest


def test_the_guard_refuses_a_subprocess():
    with pytest.raises(AssertionError, match="start no processes"):
        subprocess.run(["true"], check=False)


def test_the_guard_refuses_multiprocessing():
    with pytest.raises(AssertionError, match="start no processes"):
        multiprocessing.get_context("spawn").Process(target=print).start()
