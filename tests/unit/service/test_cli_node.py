"""``etrain node join``: what it refuses before starting anything, and the ``ray start`` it
runs (the real join, from a network namespace of its own: tests/integration/test_elastic.py)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()


@pytest.fixture
def token(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    path = tmp_path / "ray_auth_token"
    path.write_text("a" * 64)
    return path


def _join(*args: str):
    return runner.invoke(app, ["node", "join", *args])


def _said(result) -> str:
    """The output without the error box rich draws around it (it wraps lines)."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", result.output)


def test_a_dry_run_prints_the_ray_start_it_would_run_and_never_the_token(token):
    result = _join(
        "--head",
        "10.10.0.1:6379",
        "--token-file",
        str(token),
        "--num-gpus",
        "1",
        "--gpu-memory-gb",
        "24",
        "--resources",
        '{"A10G": 1}',
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert " start --address=10.10.0.1:6379 --block " in line
    assert "--num-gpus=1" in line and '--resources={"A10G": 1}' in line
    assert "--labels=etrain.io/gpu-memory-gb=24" in line
    assert "a" * 64 not in result.output


@pytest.mark.parametrize(
    "args, field, says",
    [
        (["--head", "10.10.0.1"], "--head", "is not HOST:PORT"),
        (["--head", "h:1; rm -rf /"], "--head", "is not HOST:PORT"),
        (["--head", "h:6379", "--resources", "[1]"], "--resources", "a JSON object"),
        (["--head", "h:6379", "--resources", '{"GPU": -1}'], "--resources", "a JSON object"),
    ],
)
def test_bad_options_are_refused_naming_the_option(token, args, field, says):
    result = _join(*args, "--token-file", str(token), "--dry-run")
    assert result.exit_code == 2
    assert field in _said(result) and says in _said(result)


def test_a_join_needs_a_token(token, tmp_path):
    result = _join("--head", "h:6379", "--dry-run")
    assert result.exit_code == 2 and "--token-file" in result.output
    empty = tmp_path / "empty"
    empty.write_text("")
    for bad in (empty, tmp_path, tmp_path / "missing"):
        result = _join("--head", "h:6379", "--token-file", str(bad), "--dry-run")
        assert result.exit_code == 2 and "is not a token file" in _said(result)
