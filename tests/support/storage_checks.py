"""Shared by the storage tests: example credentials, a leak check, a DCP round trip."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from workers.checkpoint.dcp_io import dcp_reader, dcp_writer

KEY, SECRET, TOKEN = "AKIAEXAMPLEKEY000001", "s3cr3t/Value+With/Slashes0000", "sess-token-xyz"
AWS = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
NAMED = {
    "ETRAIN_SECRET_MINIO_STORE_ACCESS_KEY_ID": KEY,
    "ETRAIN_SECRET_MINIO_STORE_SECRET_ACCESS_KEY": SECRET,
    "ETRAIN_SECRET_MINIO_STORE_SESSION_TOKEN": TOKEN,
}


def no_secrets(text: str, *values: str) -> None:
    """Fail if any of ``values`` (default: the example credentials) appears in ``text``."""
    for value in values or (KEY, SECRET, TOKEN):
        assert value not in text, f"secret value leaked into: {text}"


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "w": torch.randn(64, 32),
        "b": torch.arange(10, dtype=torch.float32),
        "step": torch.tensor(7),
    }


def round_trip(loc, path):
    """Save a small state with DCP under ``path`` of ``loc``, load it back, compare; return
    the writer used."""
    state = _state()
    writer = dcp_writer(loc, path)
    dcp.save(state, storage_writer=writer, no_dist=True)
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(loaded, storage_reader=dcp_reader(loc, path), no_dist=True)
    for k, v in state.items():
        assert torch.equal(loaded[k], v), k
    return writer
