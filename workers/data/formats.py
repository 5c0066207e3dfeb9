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
from collections.abc import Iterable, Iterator, Sequence
from typing import IO

from workers.data import remote
from workers.storage.confine import Roots, is_file, open_fd

FORMATS = ("text", "jsonl", "parquet")
# Parquet rows are read in batches of this many rows. Few: a row's size is not its size
# on disk (a 64 KiB string dictionary-encoded in 4,096 rows takes 81 bytes compressed), so
# 64 rows of 64 KiB are a 4 MiB batch where 4,096 were 256 MiB.
_PARQUET_BATCH = 64


def require_file(
    path: str | None, source: str, stores: remote.Stores | None = None, roots: Roots | None = None
) -> str:
    """``path`` if it is an existing file (or object); else a ValueError naming data.path.
    A local one must be a regular file beneath ``roots`` (default: the job's)."""
    if not path:
        raise ValueError(f"data.path is required when data.source is {source!r}")
    if remote.is_remote(path):
        remote.file_info(path, stores)
        return path
    if path.startswith("file://"):
        path = path.removeprefix("file://")
    if not is_file(path, Roots.from_env() if roots is None else roots):
        raise ValueError(
            f"data.path {path!r} does not exist or is not a file; set data.path to a readable file"
        )
    return path


def open_binary(
    path: str, stores: remote.Stores | None = None, roots: Roots | None = None
) -> IO[bytes]:
    """``path`` opened for reading bytes: a streaming object-store file, or a local file
    opened beneath ``roots`` (default: the job's folders, :mod:`workers.storage.confine`)."""
    if remote.is_remote(path):
        return remote.open_file(path, stores)
    roots = Roots.from_env() if roots is None else roots
    return os.fdopen(open_fd(path.removeprefix("file://"), roots), "rb")


def read_rows(
    path: str, source: str, stores: remote.Stores | None = None, *, roots: Roots | None = None
) -> Iterator[tuple[int, object]]:
    """``(row, record)`` pairs of ``path`` read as ``source`` (text, jsonl or parquet); a
    local file opened beneath ``roots`` (default: the job's)."""
    if source not in FORMATS:
        raise ValueError(f"unknown data.source {source!r}; set one of: {', '.join(FORMATS)}")
    # Binary mode so a bad UTF-8 line is reported with its number, like bad JSON.
    with open_binary(path, stores, roots) as f:
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


def _parquet_file(path: str, f: IO[bytes]):
    """``pyarrow.parquet.ParquetFile`` of ``f`` (its footer read); ValueError if it is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"data.path {path!r}: not a readable parquet file ({e})") from e


def check_columns(path: str, names: Sequence[str], wanted: Sequence[tuple[str, str]]) -> None:
    """ValueError naming ``path`` and the option to set unless every ``(column, option)`` of
    ``wanted`` is in ``names``."""
    for name, option in wanted:
        if name not in names:
            raise ValueError(
                f"data.path {path!r}: no column {name!r} (columns: {', '.join(names)}); set "
                f"data.{option} to the column the file uses"
            )


def parquet_head(
    path: str,
    wanted: Sequence[tuple[str, str]],
    *,
    max_rows: int,
    max_bytes: int,
    roots: Roots | None = None,
) -> Iterator[tuple[int, object]]:
    """The first rows (at most ``max_rows``) of the ``wanted`` columns of parquet file
    ``path``, read within about ``max_bytes`` of decoded data whatever the file holds.

    The footer comes first: a missing column is a ValueError naming the option to set
    (:func:`check_columns`), an empty file one saying so. Rows are read only from the
    first row group, only when its wanted columns take at most ``max_bytes`` uncompressed
    (column-chunk metadata), one row at a time, and only until the rows decoded so far
    take ``max_bytes`` (a dictionary-encoded value repeated in every row decodes to far
    more than its chunk's size); the rest is left to the workers, who read every row. A
    local file is opened beneath ``roots`` (default: the job's).
    """
    import pyarrow as pa

    with open_binary(path, roots=roots) as f:
        pf = _parquet_file(path, f)
        check_columns(path, pf.schema_arrow.names, wanted)
        meta = pf.metadata
        if meta.num_rows == 0:
            raise ValueError(f"data.path {path!r} holds no rows; it needs at least one")
        first = meta.row_group(0)
        columns = [name for name, _ in wanted]
        chunks = (first.column(i) for i in range(first.num_columns))
        size = sum(
            c.total_uncompressed_size for c in chunks if c.path_in_schema.split(".")[0] in columns
        )
        if size > max_bytes:
            return  # the columns' names are checked; the rows are the workers'
        row = decoded = 0
        try:
            batches = pf.iter_batches(batch_size=1, row_groups=[0], columns=columns)
            for batch in batches:
                for record in batch.to_pylist():
                    row += 1
                    yield row, record
                decoded += batch.nbytes
                if row >= max_rows or decoded >= max_bytes:
                    return
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"data.path {path!r} after row {row}: unreadable parquet ({e})") from e


def _parquet_rows(path: str, f: IO[bytes]) -> Iterator[tuple[int, object]]:
    """Rows of parquet file object ``f`` in batches (an object store serves ranged reads)."""
    import pyarrow as pa

    pf = _parquet_file(path, f)
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
