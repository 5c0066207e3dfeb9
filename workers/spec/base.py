"""The base every job-spec section derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Upper bounds of the spec's counts, so that neither validation nor planning can be made
# to take unbounded time or overflow (each one is far beyond any real job).
MAX_WORKERS = 4096  # workers of one job, and any parallel degree
MAX_STEPS = 10**9  # steps, step intervals and sample counts
MAX_SECONDS = 10**8  # any duration (about three years)


class Spec(BaseModel):
    """A section of the job spec: unknown fields are an error, not a silent no-op."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


# Sections whose values may hold a key by mistake (a storage URI with user:key@, a
# secret pasted where a name goes) keep inputs out of ValidationError's text.
SECRET_SAFE = ConfigDict(**Spec.model_config, hide_input_in_errors=True)
