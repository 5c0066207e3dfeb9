"""Reading rows of the file formats people have: jsonl, parquet and plain text.

Every reader yields ``(row, record)`` pairs, ``row`` counted from 1 (a jsonl
file's line number), so that any error can name the file and the row. Plain
text is one document: the whole file. A path may be an object-store URL
(``s3://``, ``gs://``; ``stores`` maps it to its store as the spec says,
:mod:`workers.data.remote`): its rows are streamed (:mod:`workers.data.remote`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO

from workers.data import remote

FORMATS = ("text", "jsonl", "parquet")
# Parquet rows are read in batches of this many rows (bounded memory on big files).
_PARQUET_BATCH = 4096


def require_file(path: str | None, source: str, stores: remote.Stores | None = None) -> str:
    """``path`` if it is an existing file (or object); else a ValueError naming data.path."""
    if not path:
        raise ValueError(f"data.path is required when data.source is {source!r}")
    if remote.is_remote(path):
        remote.file_info(path, stores)
        return path
    if path.startswith("file://"):
        path = path.removeprefix("file://")
    if not os.path.isfile(path):
        raise ValueError(
            f"data.path {path!r} does not exist or is not a file; set data.path to a readable file"
        )
    return path


def open_binary(path: str, stores: remote.Stores | None = None) -> IO[bytes]:
    """``path`` opened for reading bytes: a local file, or a streaming object-store file."""
    if remote.is_remote(path):
        return remote.open_file(path, stores)
    return open(path.removeprefix("file://"), "rb")


def read_rows(
    path: str, source: str, stores: remote.Stores | None = None
) -> Iterator[tuple[int, object]]:
    """``(row, record)`` pairs of ``path`` read as ``source`` (text, jsonl or parquet)."""
    if source not in FORMATS:
        raise ValueError(f"unknown data.source {source!r}; set one of: {', '.join(FORMATS)}")
    # Binary mode so a bad UTF-8 line is reported with its number, like bad JSON.
    with open_binary(path, stores) as f:
        if source == "text":
            raw = f.read()
            try:
                yield 1, {"text": raw.decode("utf-8")}
            except UnicodeDecodeError as e:
                raise ValueError(f"data.path {path!r}: not UTF-8 text ({e})") from e
        elif source == "jsonl":
            yield from jsonl_lines(path, f)
        else:
            yield from _parquet_rows(path, f)


def jsonl_lines(path: str, lines: Iterable[bytes]) -> Iterator[tuple[int, object]]:
    """``(line number, record)`` of JSON ``lines`` (blank ones skipped) read from ``path``."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"data.path {path!r} line {lineno}: invalid JSON ({e})") from e
        except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
            raise ValueError(
                f"data.path {path!r} line {lineno}: JSON nested too deeply to read (over "
                f"{sys.getrecursionlimit()} levels of [ or {{); a row is an object of strings "
                "(or a list of messages): fix or remove that line"
            ) from None
        yield lineno, record


def _parquet_rows(path: str, f: IO[bytes]) -> Iterator[tuple[int, object]]:
    """Rows of parquet file object ``f`` in batches (an object store serves ranged reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"data.path {path!r}: not a readable parquet file ({e})") from e
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH):
            for record in batch.to_pylist():
                row += 1
                yield row, record
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"data.path {path!r} after row {row}: unreadable parquet ({e})") from e


def field(path: str, row: int, record: object, name: str, kind: type, what: str):
    """``record[name]`` checked to be a ``kind``; else a ValueError naming file, row, field."""
    where = f"data.path {path!r} row {row}"
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object with a {what} field {name!r}")
    if name not in record or record[name] is None:
        raise ValueError(
            f"{where}: no field {name!r}; rows need a {what} field (set data.{_option(what)} "
            "to the field name the file uses)"
        )
    value = record[name]
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {name!r} must be a {kind.__name__}")
    return value


def _option(what: str) -> str:
    return {"text": "text_field", "prompt": "prompt_field", "completion": "completion_field"}.get(
        what, "messages_field"
    )
