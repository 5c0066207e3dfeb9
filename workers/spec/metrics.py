"""The job spec's ``metrics`` section: what the job writes for people to watch."""

from __future__ import annotations

from pydantic import Field

from workers.spec.base import Spec


class MetricsSpec(Spec):
    """Training curves written beside the checkpoints."""

    tensorboard: bool | None = Field(
        None,
        description="Rank 0 writes the per-step scalars (loss, lr, grad norm, tokens/s, "
        "samples/s, step time, world size) and the job's events (starts, restores, resizes, "
        "checkpoints) as TensorBoard event files under "
        "<checkpoint storage>/<job id>/checkpoints/tensorboard, from a background thread, on "
        "local and object storage (s3://, gs://, reached like checkpoint.storage with "
        "stores.s3 / stores.gcs: written locally and copied to the store "
        "every 10 s, before each checkpoint commits and at the end). "
        "Unset: the service's ETRAIN_TENSORBOARD_DEFAULT.",
    )
