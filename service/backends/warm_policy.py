"""The warm pool's policy: how many processes and how much memory the standby drivers may
hold (``service.backends.standby``), and when an idle pool shrinks.

One standby driver holds its own process, the processes of Ray Train's own actors for a
run (``RUN_ACTORS``: its controller, placement-group cleaner and synchronisation actor)
and one per worker it warms. The budget caps both what is started and what is kept:

- processes: standbys times their processes; a standby warms fewer workers rather than
  break it;
- memory: what the standbys reported holding (PSS); a pool over it retires its idle
  standbys down to what fits, and starts no more than that from then on;
- ``idle_s``: a pool that ran no job for that long stops its standbys; the next job starts
  cold and brings the pool back.

Unset, the budget is sized to the node the standbys run on (the head: Ray's job API
starts drivers there; ``WarmBudget.for_node``).
"""

from __future__ import annotations

from service.settings.slices import WarmBudget

RUN_ACTORS = 3  # workers.warm.spares.RUN_ACTORS: Ray Train's actors per run

__all__ = ["RUN_ACTORS", "WarmBudget", "fit", "processes_per_standby"]


def processes_per_standby(workers: int) -> int:
    """What one standby warming ``workers`` workers holds: itself, the run's actors, them."""
    return 1 + RUN_ACTORS + workers


def fit(
    budget: WarmBudget, *, wanted: int, workers: int, memory_each: int | None
) -> tuple[int, int]:
    """(standbys, workers each) within ``budget``: at most ``wanted`` standbys of at most
    ``workers`` workers; ``memory_each``: what one standby reported holding, if known."""
    processes = budget.processes or 0
    workers = max(min(workers, processes - processes_per_standby(0)), 0)
    count = min(wanted, processes // processes_per_standby(workers)) if processes else 0
    if memory_each and budget.memory_bytes is not None:
        count = min(count, budget.memory_bytes // memory_each)
    return max(count, 0), workers
