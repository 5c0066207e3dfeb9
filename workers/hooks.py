"""Hooks a run lets its environment install: the seam tests use to inject faults.

A production run installs none (``RunEnv.hooks`` is None and the loop skips
them). Tests and drills install a :class:`RunHooks` subclass, in-process through
``RunEnv(hooks=...)``, or on a Ray job through ``ETRAIN_RUN_HOOKS=module:function``
in the job's environment (:func:`load_hooks`, called by the driver and by every
worker); ``tests/support/faults.py`` is the one the test suite ships.
"""

from __future__ import annotations

import importlib
import os

from workers.contract import RUN_HOOKS_ENV


class RunHooks:
    """Points where a run calls out; every method does nothing unless overridden."""

    def after_step(self, *, step: int, rank: int) -> None:
        """Called on every rank once ``step`` is done (and timed), before it is reported
        or checkpointed."""

    def storage_writer(self, writer, *, step: int):
        """The DCP storage writer an asynchronous save of ``step`` writes through."""
        del step
        return writer


def load_hooks(target: str | None = None) -> RunHooks | None:
    """The hooks ``target`` (``module:function``; default ``$ETRAIN_RUN_HOOKS``) returns,
    or None when it is unset."""
    target = os.environ.get(RUN_HOOKS_ENV) if target is None else target
    if not target:
        return None
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"{RUN_HOOKS_ENV} must be module:function, got {target!r}")
    return getattr(importlib.import_module(module), name)()
