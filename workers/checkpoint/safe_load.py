"""Reading a checkpoint without running code from it.

A checkpoint is read back from its job's ``checkpoint.storage``, which the service's
access policy confined at submit to the tenant's own area (or an object-store prefix
the operator granted it), so no other tenant can have written it. On top of that,
nothing read from a checkpoint may run code when it is unpickled:

- tensor shards: DCP's readers already use ``torch.load(weights_only=True)``;
- non-tensor values (optimizer hyper-parameters and the like, DCP's "bytes" items):
  :class:`SafeLoadPlanner` loads them with ``weights_only=True`` (DCP's
  ``DefaultLoadPlanner`` uses ``weights_only=False``);
- DCP's ``.metadata``, a plain pickle that DCP reads with ``pickle.load``:
  :func:`load_metadata` unpickles it with an allow-list of the classes DCP metadata
  is made of (dataclasses of ``torch.distributed.checkpoint``, ``torch.Size``,
  dtypes, layouts and paths); any other global is refused;
- per-rank RNG states: plain tensors, loaded with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from typing import IO, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
)
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by name (torch.strided)
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file names something that could run code when loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals DCP metadata is made of."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _DCP_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (
                dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)
            ):
                return obj
        raise UnsafeCheckpoint(
            f"checkpoint metadata refers to {module}.{name}, which is not part of DCP "
            "metadata; refusing to load it (the file was not written by etrain)"
        )


def load_metadata(f: IO[bytes]) -> Metadata:
    """DCP's ``.metadata`` from ``f``, unpickled with the allow-list; UnsafeCheckpoint when
    it names anything else or is not DCP metadata."""
    metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(
            f"checkpoint metadata holds a {type(metadata).__name__}, not DCP Metadata"
        )
    return metadata


class SafeMetadataReader:
    """Mixin for DCP's file-system readers: ``read_metadata`` through :func:`load_metadata`
    (the same steps as ``FileSystemReader.read_metadata``, without ``pickle.load``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))  # type: ignore[attr-defined]
        with self.fs.create_stream(path, "rb") as f:  # type: ignore[attr-defined]
            metadata = load_metadata(f)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[attr-defined]
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_tensors(f: IO[bytes]) -> Any:
    """A file of tensors (and plain containers of them), never running code."""
    return torch.load(f, weights_only=True)
