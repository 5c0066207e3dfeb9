"""Which committed checkpoints a job keeps: the one place this is decided.

The newest ``keep_last`` are kept, and with ``keep_every`` N also every
checkpoint whose step is a multiple of N (long-lived milestones). The
checkpoint manager applies it after each commit (so an old checkpoint is never
deleted before a newer one exists) and reports what it deleted; the control
plane follows that report instead of applying the rule again.
"""

from __future__ import annotations

from collections.abc import Iterable


def retained_steps(
    steps: Iterable[int], *, keep_last: int | None, keep_every: int | None = None
) -> set[int]:
    """The subset of committed ``steps`` to keep; ``keep_last=None`` keeps all."""
    ordered = sorted(set(steps))
    if keep_last is None:
        return set(ordered)
    kept = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        kept |= {s for s in ordered if s % keep_every == 0}
    return kept
