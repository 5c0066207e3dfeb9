"""Tiny Hugging Face model folders for the generation tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hf_fixtures import ARCHITECTURES, make_hf_folder

FAMILIES = tuple(ARCHITECTURES)  # every family etrain maps


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny random model folder (weights and tokenizer) per family."""
    root = tmp_path_factory.mktemp("hf")
    return {arch: _made(root / arch, arch) for arch in FAMILIES}


def _made(path: Path, arch: str) -> Path:
    make_hf_folder(path, arch, seed=7)
    return path
