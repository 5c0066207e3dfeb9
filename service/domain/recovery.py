"""Job-level recovery policy: when a Ray job ends badly, resubmit it or let it fail. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from service.backends.base import RunState, RunStatus
from workers.contract import EXIT_TRAINING_FAILED


@dataclass(frozen=True)
class RecoveryDecision:
    """Resubmit the job (resuming from its newest checkpoint), or record it as failed."""

    resubmit: bool
    reason: str


def decide_recovery(
    status: RunStatus, *, resubmits: int, max_resubmits: int, cause: str | None = None
) -> RecoveryDecision:
    """Resubmit when the driver or the cluster died under a healthy job, within the budget;
    ``cause``: what the reason says happened, where the caller knows better than Ray.

    MISSING (the Ray head lost the job, e.g. it restarted) and a driver that
    did not exit through etrain's own failure path (killed, OOM, supervisor
    lost) count as cluster-level losses. A STOPPED job was stopped by someone.
    """
    if status.state == RunState.STOPPED:
        return RecoveryDecision(False, "the Ray job was stopped outside etrain")
    if status.state == RunState.FAILED and status.exit_code == EXIT_TRAINING_FAILED:
        return RecoveryDecision(False, status.message or "training failed")
    cause = cause or (
        "the Ray cluster lost the job"
        if status.state == RunState.MISSING
        else f"the job driver died (exit code {status.exit_code})"
    )
    if resubmits >= max_resubmits:
        return RecoveryDecision(
            False, f"{cause}; failure.max_resubmits ({max_resubmits}) already used"
        )
    return RecoveryDecision(True, f"{cause}; resubmitting ({resubmits + 1}/{max_resubmits})")
