"""The events a worker group reports about itself: it started (and where it picked up), the
memory every rank measured at its first step, and that early stopping ended the run. Rank 0
reports; every rank calls."""

from __future__ import annotations

import uuid

import torch.distributed as dist

from workers.contract import EventKind


def announce_start(reporter, rank: int, world_size: int, start: int, restored: dict | None):
    """``workers_started``, and ``restored`` (from step ``start``, with the world size of the
    checkpoint's manifest ``restored``) when the group resumed."""
    if rank != 0 or reporter is None:
        return
    nonce = uuid.uuid4().hex[:12]
    reporter.event(
        EventKind.WORKERS_STARTED,
        f"{world_size} workers started",
        data={"world_size": world_size},
        dedup_key=f"start:{nonce}",
    )
    if not start:
        return
    saved_world = (restored or {}).get("world_size")
    # Ray Train's controller reports the resize itself ("resized 4 → 2 (node
    # lost)", workers.elastic.scaling); this says where the new group picked up.
    moved = (
        f" (saved by {saved_world} workers, now {world_size})"
        if saved_world is not None and saved_world != world_size
        else ""
    )
    reporter.event(
        EventKind.RESTORED,
        f"restored from step {start}{moved}",
        data={"step": start, "world_size": world_size, "saved_world_size": saved_world},
        dedup_key=f"restore:{nonce}",
    )


def gather_memory(mine: dict, *, rank: int, reporter) -> list[dict]:
    """Gather every rank's measured memory (``mine`` here); rank 0 reports it as a
    ``memory`` event."""
    ranks: list = [mine]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    if rank == 0 and reporter is not None:
        reporter.event(
            EventKind.MEMORY,
            "per-rank memory measured at the first step",
            data={"ranks": ranks},
            dedup_key=f"memory:{uuid.uuid4().hex[:12]}",
        )
    return ranks


def report_early_stop(reporter, rank: int, step: int, stopping) -> None:
    """``early_stopped`` at ``step``: the held-out loss did not improve on ``stopping.best``
    for ``stopping.patience`` evaluations."""
    if rank != 0 or reporter is None:
        return
    reporter.event(
        EventKind.EARLY_STOPPED,
        f"stopped early at step {step}: eval_loss has not improved on {stopping.best:.6g} "
        f"for {stopping.bad} evaluations",
        data={"step": step, "best_eval_loss": stopping.best, "evaluations": stopping.bad},
        dedup_key=f"early-stop:{step}",
    )
