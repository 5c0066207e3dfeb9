"""Which committed checkpoints a job keeps: the one place this is decided.

The newest ``keep_last`` are kept, with ``keep_every`` N also every
checkpoint whose step is a multiple of N (long-lived milestones), and with
``keep_best`` K also the K whose held-out loss is lowest (of those whose step
evaluated; a tie keeps the earlier step). The
checkpoint manager applies it after each commit (so an old checkpoint is never
deleted before a newer one exists) and reports what it deleted; the control
plane follows that report instead of applying the rule again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def retained_steps(
    steps: Iterable[int],
    *,
    keep_last: int | None,
    keep_every: int | None = None,
    keep_best: int | None = None,
    losses: Mapping[int, float] | None = None,
) -> set[int]:
    """The subset of committed ``steps`` to keep; ``keep_last=None`` keeps all.
    ``losses``: the held-out loss of the steps that have one (what ``keep_best`` ranks)."""
    ordered = sorted(set(steps))
    if keep_last is None:
        return set(ordered)
    kept = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        kept |= {s for s in ordered if s % keep_every == 0}
    if keep_best:
        kept |= set(best_steps(ordered, losses or {}, keep_best))
    return kept


def best_steps(steps: Iterable[int], losses: Mapping[int, float], k: int) -> list[int]:
    """The (at most) ``k`` of ``steps`` with the lowest loss in ``losses``, best first; steps
    without a loss are not ranked, a tie goes to the earlier step."""
    ranked = sorted((losses[s], s) for s in set(steps) if losses.get(s) is not None)
    return [s for _, s in ranked[:k]]
