"""Fixtures for the Kubernetes tests."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.k8s.kustomize_cli import INSTALL_HINT, build, kustomize_path


def _on_ci() -> bool:
    """True when the environment says this is a CI run (the rule tests/conftest.py uses)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def kustomize_build() -> Callable[[Path], list[dict]]:
    """``kustomize build`` by the real binary; a missing binary fails on CI and skips elsewhere.

    Builds are cached for the session because kustomize 4.5.4 spends about a
    second of CPU loading its OpenAPI schema on every run; each call gets a copy.
    """
    binary = kustomize_path()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        message = f"no kustomize binary at {binary}; {INSTALL_HINT}"
        if _on_ci() or os.environ.get("ETRAIN_KUSTOMIZE"):
            # CI, or a binary asked for by name, must not quietly skip the deploy/ tests.
            pytest.fail(message, pytrace=False)
        pytest.skip(message)

    @functools.cache
    def cached(directory: Path) -> list[dict]:
        return build(directory, binary=binary)

    return lambda directory: copy.deepcopy(cached(Path(directory).resolve()))
