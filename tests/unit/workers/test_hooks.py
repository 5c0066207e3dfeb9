"""RunHooks: what a run lets tests install, and how a Ray job names them."""

from __future__ import annotations

import pytest

from workers.contract import RUN_HOOKS_ENV
from workers.hooks import RunHooks, load_hooks


class Counting(RunHooks):
    instances = 0

    def __init__(self):
        Counting.instances += 1


def test_no_hooks_unless_the_environment_names_them(monkeypatch):
    monkeypatch.delenv(RUN_HOOKS_ENV, raising=False)
    assert load_hooks() is None


def test_the_environment_names_a_factory_as_module_function(monkeypatch):
    monkeypatch.setenv(RUN_HOOKS_ENV, f"{__name__}:Counting")
    before = Counting.instances
    hooks = load_hooks()
    assert isinstance(hooks, Counting) and Counting.instances == before + 1


@pytest.mark.parametrize("target", ["no-colon", ":missing_module", "tests.unit:"])
def test_a_malformed_target_says_what_is_expected(target):
    with pytest.raises(ValueError, match=f"{RUN_HOOKS_ENV} must be module:function"):
        load_hooks(target)


def test_the_defaults_do_nothing():
    hooks, writer = RunHooks(), object()
    assert hooks.after_step(step=1, rank=0) is None
    assert hooks.storage_writer(writer, step=1) is writer
