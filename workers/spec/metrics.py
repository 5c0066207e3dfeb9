"""The job spec's ``metrics`` section: what the job writes for people to watch."""

from __future__ import annotations

from pydantic import Field

from workers.spec.base import Spec


class MetricsSpec(Spec):
    """Training curves written beside the checkpoints."""

    tensorboard: bool | None = Field(
        None,
        description="Rank 0 writes the per-step scalars (loss, lr, tokens/s, world size) and "
        "the job's events (starts, restores, checkpoints) as TensorBoard event files under "
        "<checkpoint storage>/<job id>/checkpoints/tensorboard, from a background thread; "
        "file:// storage only for now. Unset: the service's ETRAIN_TENSORBOARD_DEFAULT.",
    )
