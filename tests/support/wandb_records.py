"""The records of an offline W&B run, read back from its ``.wandb`` file: W&B's own
protobuf (``wandb.proto.wandb_internal_pb2.Record``) in the file's framing (a ``:W&B``
header, then 32 KiB blocks of records, each with a CRC-32, a length and a type: full,
first, middle or last part), which the Python package no longer ships a reader for."""

from __future__ import annotations

import glob
import json
import os
import struct
import zlib

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str):
    """Every Record of the ``.wandb`` file at ``path``, in order (CRCs checked)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()  # noqa: SIM115 - read whole
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, parts = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:
            break
        body = data[pos + _HEADER : pos + _HEADER + length]
        assert zlib.crc32(bytes([kind]) + body) == crc, f"{path}: bad record at {pos}"
        pos += _HEADER + length
        parts += body
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def run_file(folder) -> str:
    """The one offline run's ``.wandb`` file under ``folder`` (a run's ``dir``)."""
    found = glob.glob(os.path.join(str(folder), "wandb", "offline-run-*", "run-*.wandb"))
    assert len(found) == 1, found
    return found[0]


def history(path: str) -> list[dict]:
    """Each history row (``run.log``) of the run file, as a dict."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def runs(path: str) -> list:
    """Each RunRecord of the run file (the first, and each update: notes, config...)."""
    return [r.run for r in records(path) if r.WhichOneof("record_type") == "run"]


def artifacts(path: str) -> list:
    """Each ArtifactRecord of the run file."""
    return [r.artifact for r in records(path) if r.WhichOneof("record_type") == "artifact"]
