"""Checkpoints that do not stall training: stage, write in the background, commit later.

``checkpoint.async: true`` saves through DCP's ``async_save``: the state dict is
copied to host memory (the only part that blocks the loop), then a background
thread writes the shards while training goes on. The commit protocol is the one
of :class:`~workers.checkpoint.manager.CheckpointManager` (shards and ``.metadata`` in a
staging folder, then the manifest and the rename), so a checkpoint is visible
only once every rank's shards are written.

At most one save is in flight. Each step the loop votes on whether this rank's
save has finished (the vote rides on the step's loss all-reduce); when all ranks
have, every rank calls :meth:`AsyncSaver.finish` at that same step and rank 0
commits. A save that reaches the next save point unfinished is waited for. A
failed save (storage gone, disk full) is reported and dropped: training goes on,
and the next interval tries again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from workers.checkpoint.manager import CheckpointInfo, CheckpointManager


@dataclass
class InFlight:
    """One asynchronous save between its start and its commit."""

    step: int
    staging: str
    extra: dict
    future: Future
    started: float  # perf_counter at the start
    blocking_s: float  # time the training loop was held by this save


@dataclass(frozen=True)
class SaveOutcome:
    """What finishing a save produced: the committed checkpoint, or why it failed."""

    step: int
    info: CheckpointInfo | None
    blocking_s: float
    total_s: float
    error: str | None = None


class AsyncSaver:
    """Asynchronous saves through ``manager``; every method is called by all ranks alike."""

    def __init__(
        self, manager: CheckpointManager, *, wrap_writer: Callable[..., object] | None = None
    ):
        """``wrap_writer(writer, step=N)`` may replace each save's DCP writer (RunHooks)."""
        self.manager, self.wrap_writer = manager, wrap_writer
        self.inflight: InFlight | None = None
        # The background writes use their own gloo group: collectives of the save's
        # thread must never interleave with the training thread's on one group.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None

    def start(self, *, step: int, app_state: Stateful, extra: dict, waited_s: float = 0.0) -> None:
        """Stage ``app_state`` (blocking) and write it in the background.

        If any rank cannot even create its attempt folder (the store is down), no
        rank starts writing: the save is recorded as failed, to be reported by
        :meth:`finish` like any other failure.
        """
        assert self.inflight is None, "finish the save in flight first"
        t0 = time.perf_counter()
        staging, error = "", None
        try:
            staging = self.manager.begin(step)
        except Exception as e:  # noqa: BLE001 - reported at finish; the next interval retries
            error = describe_failure(e)
        if _all_agree(error is None):
            writer = self.manager.writer(staging)
            if self.wrap_writer is not None:
                writer = self.wrap_writer(writer, step=step)
            future = dcp.async_save(
                {"app": app_state},
                storage_writer=writer,
                process_group=self._group,
                no_dist=self._group is None,
            )
        else:
            future = Future()
            future.set_exception(OSError(error or "another rank could not start its save"))
        self.inflight = InFlight(
            step=step,
            staging=staging,
            extra=extra,
            future=future,
            started=t0 - waited_s,
            blocking_s=time.perf_counter() - t0 + waited_s,
        )

    def written_here(self) -> bool:
        """Whether this rank's part of the save in flight is done (written or failed)."""
        return self.inflight is not None and self.inflight.future.done()

    def finish(self) -> SaveOutcome | None:
        """Collective: wait for this rank's writes, then commit on rank 0 (if all succeeded)."""
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            return None
        t_wait = time.perf_counter()
        error = None
        try:
            inflight.future.result()
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - reported; retried next
            # (DCP's CheckpointException derives from BaseException.)
            error = describe_failure(e)
        waited = time.perf_counter() - t_wait
        total = time.perf_counter() - inflight.started
        info = self.manager.commit(
            inflight.staging,
            step=inflight.step,
            extra=inflight.extra,
            save_s=total,
            ok=error is None,
        )
        if info is None and error is None:
            error = self.manager.commit_error or "another rank failed to write its shards"
        return SaveOutcome(
            step=inflight.step,
            info=info,
            blocking_s=inflight.blocking_s + waited,
            total_s=total,
            error=error,
        )


def describe_failure(e: BaseException) -> str:
    """One line saying why a save failed; DCP wraps each rank's error in ``failures``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, cause = sorted(failures.items())[0]
        return f"rank {rank}: {describe_failure(cause)}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def _all_agree(ok: bool) -> bool:
    """Collective: True when ``ok`` holds on every rank."""
    if not dist.is_initialized():
        return ok
    vote = torch.tensor([0.0 if ok else 1.0])
    dist.all_reduce(vote)
    return vote.item() == 0
