"""``model.hf`` in an object store (``s3://`` / ``gs://``): small files whole, weights by range.

The store is reached with the job's own store options: the caller passes
``stores``, a function of a URL to its ``StorageLocation`` (the training loop and
export pass :func:`workers.storage.location.stores_for` over the spec's
``stores`` section, whose ``s3`` / ``gcs`` options apply when the model's scheme
is theirs; credentials from the environment, which the job's
workers get for every store the spec names:
:func:`workers.storage.location.job_credential_env`). This package sits below
``workers.checkpoint``, so it takes the function rather than importing it;
without one, fsspec's defaults reach the store.

``config.json`` and ``model.safetensors.index.json`` are read whole, bounded. A
safetensors file is never downloaded: its header (8-byte little-endian length,
then JSON ``{name: {dtype, shape, data_offsets}}``) is read with two ranged
reads, and a tensor's block with one more covering the rows a rank owns (rows
are contiguous in row-major order; a column block is cut from them in memory,
one tensor at a time). Neither ``safetensors`` (``safe_open`` takes a local
path) nor ``huggingface_hub`` (its header reader speaks to the Hub) parses a
header from an fsspec file, so the format's two fields are read here.
:class:`RemoteWeights` counts the bytes it fetched (``bytes_fetched``).
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workers.models.hf_index import INDEX, MAX_INDEX_BYTES, SINGLE, weight_map
from workers.storage.location import is_remote as is_remote  # the one rule, asked here too

log = logging.getLogger(__name__)

Stores = Callable[[str], Any]  # a URL -> its StorageLocation (fs, root, join, uri)
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class PlainLocation:
    """A store reached with fsspec's defaults (no ``stores`` given): the part of
    ``StorageLocation`` this module uses."""

    uri: str
    fs: Any
    root: str

    def join(self, *parts: str) -> str:
        """A path under ``root`` as ``fs`` sees it."""
        return posixpath.join(self.root, *(p.strip("/") for p in parts if p.strip("/")))


def model_location(uri: str, stores: Stores | None = None, *, where: str = "model.hf"):
    """The store holding ``uri`` (through ``stores``, else fsspec's defaults);
    ``ValueError`` naming ``where`` when it cannot be resolved."""
    try:
        if stores is not None:
            return stores(uri)
        import fsspec

        fs, root = fsspec.core.url_to_fs(uri)
        return PlainLocation(uri=uri.rstrip("/"), fs=fs, root=root.rstrip("/"))
    except (ImportError, ValueError) as e:
        raise ValueError(f"{where} {uri}: {e}") from None


def read_small(loc, name: str, limit: int, *, where: str = "model.hf") -> bytes:
    """The whole file ``name`` under ``loc`` (at most ``limit`` bytes); ``ValueError``
    naming ``where`` if it is missing or larger."""
    path = loc.join(name)
    try:
        with loc.fs.open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise ValueError(
            f"{where} {loc.uri} has no {name}; name the folder transformers' save_pretrained "
            "wrote (config.json + model.safetensors)"
        ) from None
    except OSError as e:  # refused credentials, no bucket, no answer: the client's words
        raise ValueError(f"{where} {loc.uri}: reading {name}: {type(e).__name__}: {e}") from e
    if len(data) > limit:
        raise ValueError(f"{where} {loc.uri}: {name} is larger than {limit} bytes")
    return data


class RemoteWeights:
    """The safetensors weights of a model folder in an object store, read by byte range."""

    def __init__(self, loc, *, where: str = "model.hf"):
        """Read the index (or the single file's header) of the folder at ``loc``."""
        self.loc, self.where, self.bytes_fetched = loc, where, 0
        self._headers: dict[str, tuple[dict, int]] = {}
        self.files = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        fs = self.loc.fs
        if fs.isfile(self.loc.join(INDEX)):
            raw = read_small(self.loc, INDEX, MAX_INDEX_BYTES, where=self.where)
            return {n: self.loc.join(f) for n, f in weight_map(raw, where=self.where).items()}
        if fs.isfile(self.loc.join(SINGLE)):
            path = self.loc.join(SINGLE)
            return dict.fromkeys(self._header(path)[0], path)
        raise ValueError(
            f"{self.where}: {self.loc.uri!r} has neither {SINGLE} nor {INDEX}; "
            "etrain reads safetensors weights"
        )

    def _fetch(self, path: str, start: int, end: int) -> bytes:
        try:
            data = self.loc.fs.cat_file(path, start=start, end=end)
        except OSError as e:
            raise ValueError(f"{self.where} {self.loc.uri}: reading {path}: {e!r}") from e
        if len(data) != end - start:
            raise ValueError(f"{self.where}: {path} ends before byte {end} (truncated file?)")
        self.bytes_fetched += len(data)
        return data

    def _header(self, path: str) -> tuple[dict, int]:
        """(tensor entries, offset of the data section) of the safetensors file ``path``."""
        if path not in self._headers:
            (size,) = struct.unpack("<Q", self._fetch(path, 0, 8))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"{self.where}: {path} is not a safetensors file")
            header = json.loads(self._fetch(path, 8, 8 + size))
            header.pop("__metadata__", None)
            self._headers[path] = (header, 8 + size)
        return self._headers[path]

    def names(self):
        """Every tensor name the folder holds."""
        return self.files.keys()

    def _entry(self, name: str) -> tuple[dict, int, str]:
        path = self.files[name]
        header, base = self._header(path)
        if name not in header:
            raise ValueError(f"{self.where}: {path} has no tensor {name!r} (index is wrong)")
        return header[name], base, path

    def shape(self, name: str) -> list[int]:
        """The stored shape of tensor ``name``."""
        return list(self._entry(name)[0]["shape"])

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """``tensor[index]`` (one slice per dim, steps of 1): the covering rows, one ranged read."""
        entry, base, path = self._entry(name)
        shape, dtype = entry["shape"], DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{self.where}: tensor {name!r} has dtype {entry['dtype']}")
        start, stop, _ = index[0].indices(shape[0])
        row = math.prod(shape[1:]) * dtype.itemsize
        begin = base + entry["data_offsets"][0] + start * row
        raw = self._fetch(path, begin, begin + (stop - start) * row) if stop > start else b""
        rows = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        rows = rows.reshape(stop - start, *shape[1:])
        return rows[(slice(None), *index[1:])].contiguous()
