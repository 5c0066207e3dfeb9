"""Every Ray private API etrain uses is still what it was written against.

``workers.ray_compat_check.check`` probes each use of ``workers.ray_compat``; these tests
fail naming the one the installed Ray no longer supports, and fail outright when the
installed Ray is not the release the project pins, so that an upgrade re-verifies every
use on purpose.
"""

from __future__ import annotations

import pytest
import ray
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy

from workers import ray_compat, ray_compat_check


def test_the_installed_ray_is_the_release_the_private_uses_were_written_against():
    assert ray.__version__ == ray_compat.RAY_VERSION, (
        f"Ray {ray.__version__} is installed; workers/ray_compat.py was written against "
        f"{ray_compat.RAY_VERSION}: re-verify each of {list(ray_compat_check.CHECKS)} and update "
        "RAY_VERSION (workers/contract.py) and the pin in pyproject.toml together"
    )


@pytest.mark.parametrize("name", list(ray_compat_check.CHECKS))
def test_each_private_use_still_finds_what_it_needs(name):
    assert ray_compat_check.CHECKS[name](), f"Ray no longer supports: {name}"


def test_the_check_names_a_use_the_installed_ray_broke(monkeypatch):
    """The check is not vacuous: a private method Ray renamed is reported by name."""
    monkeypatch.delattr(ElasticScalingPolicy, "_count_possible_workers")
    broken = ray_compat_check.check()
    assert len(broken) == 1 and "_count_possible_workers" in broken[0]


def test_a_probe_that_raises_is_reported_with_the_error(monkeypatch):
    monkeypatch.setitem(
        ray_compat_check.CHECKS,
        "a module Ray removed",
        lambda: __import__("ray._private.no_such_module"),
    )
    assert any(
        b.startswith("a module Ray removed (ModuleNotFoundError") for b in ray_compat_check.check()
    )


def test_the_pinned_version_matches_the_project_pin():
    import tomllib
    from pathlib import Path

    deps = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert f"ray[train,default]=={ray_compat.RAY_VERSION}" in deps["project"]["dependencies"]
