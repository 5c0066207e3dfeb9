"""The base every job-spec section derives from."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

# Upper bounds of the spec's counts, so that neither validation nor planning can be made
# to take unbounded time or overflow (each one is far beyond any real job).
MAX_WORKERS = 4096  # workers of one job, and any parallel degree
MAX_STEPS = 10**9  # steps, step intervals and sample counts
MAX_SECONDS = 10**8  # any duration (about three years)

# C0 and C1 control characters (NUL, tab, newline, escape, DEL, ...): no path or URL a
# job names holds one, and the OS refuses a NUL in a path (ValueError, not OSError).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class Spec(BaseModel):
    """A section of the job spec: unknown fields are an error, not a silent no-op."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


# Sections whose values may hold a key by mistake (a storage URI with user:key@, a
# secret pasted where a name goes) keep inputs out of ValidationError's text.
SECRET_SAFE = ConfigDict(**Spec.model_config, hide_input_in_errors=True)


def printable(value: str | None, field: str) -> str | None:
    """``value`` unless it holds a control character; else a ValueError naming ``field``,
    the character and its position (never the value, which may hold a key)."""
    found = None if value is None else _CONTROL.search(value)
    if found is None:
        return value
    raise ValueError(
        f"{field} must not contain control characters; character {found.start() + 1} is "
        f"U+{ord(found.group()):04X}: remove it (a path or URL is printable text)"
    )


def field_loc(field: str) -> tuple:
    """A dotted field name as an error location: ``data.sources.1.path`` -> ("data",
    "sources", 1, "path"), as pydantic gives locations."""
    return tuple(int(p) if p.isdigit() else p for p in field.split("."))
