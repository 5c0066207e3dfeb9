"""The base every job-spec section derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """A section of the job spec: unknown fields are an error, not a silent no-op."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


# Sections whose values may hold a key by mistake (a storage URI with user:key@, a
# secret pasted where a name goes) keep inputs out of ValidationError's text.
SECRET_SAFE = ConfigDict(**Spec.model_config, hide_input_in_errors=True)
