"""Which places a spec names are object stores (torch-free: the service asks too)."""

from __future__ import annotations

OBJECT_STORES = ("s3://", "gs://")


def is_remote(uri: str | None) -> bool:
    """Whether ``uri`` names an object store (``s3://`` or ``gs://``)."""
    return bool(uri) and str(uri).startswith(OBJECT_STORES)
