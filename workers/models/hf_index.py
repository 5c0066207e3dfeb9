"""A sharded Hugging Face model's ``model.safetensors.index.json``, read the same way
everywhere it is read: the service's check at submit, and the workers' local and
object-store loaders. Torch-free.

The index is tenant input: its ``weight_map`` names files the loader will open, so each
name must be relative and stay inside the model's folder (no absolute path, no ``..``),
and the number of files it names is bounded.
"""

from __future__ import annotations

import json

from workers.storage.confine import child_name

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 16 << 20  # a 70B model's index is about 100 KB
MAX_SHARDS = 10_000


def weight_map(raw: bytes | str, *, where: str = "model.hf") -> dict[str, str]:
    """Tensor name -> the file holding it, relative to the model's folder, from the text of
    an index. ``ValueError`` naming ``where`` and the index when it has no ``weight_map``
    object, names more than ``MAX_SHARDS`` files, or names one outside the folder
    (:class:`~workers.storage.confine.ConfinementError`, a ``PermissionError``)."""
    try:
        items = list(json.loads(raw)["weight_map"].items())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ValueError(f"{where} {INDEX} has no weight_map object") from None
    at = f"{where} {INDEX} weight_map"
    files = {name: child_name(file, where=at) for name, file in items}
    shards = len(set(files.values()))
    if shards > MAX_SHARDS:
        raise ValueError(f"{at} names {shards} files, over {MAX_SHARDS}")
    return files
