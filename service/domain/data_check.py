"""Submit-time checks of a job's data, torch-free and bounded.

What can be told without tokenizing is checked before a job is queued: the
shape has what it needs (a tokenizer for instruction, chat and parquet; rows
with fields for instruction and chat), and, when the file is visible where the
service runs, that it parses and its first rows have the fields the shape
reads, or that a prepared folder's index matches the spec. Only the first
:data:`MAX_ROWS` rows (within :data:`MAX_JSONL_BYTES` of jsonl, :data:`MAX_TEXT_BYTES`
of plain text, of parquet the wanted columns of its first row group within
:data:`MAX_PARQUET_BYTES` decoded, or only its columns' names when that row group is
larger) are read, so a large or highly compressed file costs a bounded time and memory;
the workers check every row when they tokenize.
A file the service cannot see (it may live on the workers only) is left to them.

Data on an object store (``s3://``, ``gs://``) is read through the submit path's
:class:`~service.domain.storage_check.StorageProbes` (a probe thread with short
timeouts and per-tenant bounds, never the event loop), with the job's store
options and the service's credentials, and only its head: :data:`MAX_REMOTE_BYTES`
of jsonl or text, a parquet file's schema (its footer; the rows are the workers'
to check), a prepared folder's ``index.json``. A store that does not answer within
the probe timeout is a 422 naming ``data.path``.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os

from workers.data.formats import check_columns, field, jsonl_lines, parquet_head
from workers.data.prepare import read_index
from workers.spec import JobSpec
from workers.storage.confine import UNCONFINED, Roots, is_file, opened
from workers.storage.location import is_remote

MAX_ROWS = 200
MAX_TEXT_BYTES = 1 << 20
MAX_JSONL_BYTES = 8 << 20
MAX_REMOTE_BYTES = 1 << 20
# Decoded bytes of a parquet file's head the check reads, and the uncompressed size (from
# the footer) of the first row group's wanted columns above which it reads only the schema.
MAX_PARQUET_BYTES = 4 << 20
PATH = ("data", "path")


def data_refusals(
    spec: JobSpec, *, probes=None, tenant: str = "", roots: Roots = UNCONFINED
) -> list[tuple[tuple, str]]:
    """(field path, why and what to do) for each problem of ``spec``'s data section;
    object-store data is read through ``probes`` (for ``tenant``), or left to the workers
    when there are none; a local file is opened beneath ``roots`` (the tenant's folders)."""
    data = spec.data
    tokenizer = spec.model.tokenizer or spec.model.hf
    if data.source == "synthetic":
        return []  # (a shape that reads fields is refused by the spec itself)
    needs_tokenizer = data.shape != "text" or data.source == "parquet"
    if data.source != "prepared" and tokenizer is None and needs_tokenizer:
        what = f"data.shape {data.shape}" if data.shape != "text" else "data.source parquet"
        return [
            (
                ("model", "tokenizer"),
                f"{what} needs a tokenizer: set model.tokenizer (or model.hf) to a folder "
                "with tokenizer.json",
            )
        ]
    if is_remote(data.path):
        return [] if probes is None else _remote_refusals(spec, probes, tenant)
    path = (data.path or "").removeprefix("file://")
    if "://" in path or not os.path.exists(path):
        return []  # not visible here: the workers read it (and name it if it is missing)
    try:
        _check(path, spec, roots)
    except (ValueError, OSError) as e:
        return [(PATH, str(e))]
    return []


def _check(path: str, spec: JobSpec, roots: Roots) -> None:
    data = spec.data
    if data.source == "prepared":
        _check_prepared(path, spec, roots)
        return
    if not is_file(path, roots):
        raise ValueError(f"data.path {path!r} is not a file; name the data file")
    if data.source == "text":
        with opened(path, roots) as f:
            _check_text_head(path, f.read(MAX_TEXT_BYTES))
        return
    if data.source == "parquet":
        rows = parquet_head(
            path, _wanted_columns(spec), max_rows=MAX_ROWS, max_bytes=MAX_PARQUET_BYTES, roots=roots
        )
        for row, record in rows:
            _check_row(path, row, record, spec)
        return
    _check_rows(path, _head_rows(path, roots), spec)


def _check_rows(path: str, rows, spec: JobSpec) -> None:
    rows = itertools.islice(rows, MAX_ROWS)
    seen = 0
    for row, record in rows:
        _check_row(path, row, record, spec)
        seen += 1
    if not seen:
        raise ValueError(f"data.path {path!r} holds no rows; it needs at least one")


def _head_rows(path: str, roots: Roots):
    """The rows of a jsonl file's head: its lines within :data:`MAX_JSONL_BYTES` (a line
    cut there is left to the workers), read beneath ``roots``."""
    with opened(path, roots) as f:
        head = f.read(MAX_JSONL_BYTES + 1)
    return _head_lines(path, head, MAX_JSONL_BYTES)


def _head_lines(path: str, head: bytes, limit: int):
    """The JSON lines of ``head`` (a line cut at ``limit`` bytes is dropped)."""
    lines = head[:limit].split(b"\n")
    if len(head) > limit:
        lines = lines[:-1]
    return jsonl_lines(path, lines)


def _check_row(path: str, row: int, record: object, spec: JobSpec) -> None:
    data = spec.data
    if data.shape == "text":
        field(path, row, record, data.text_field, str, "text")
    elif data.shape == "instruction":
        field(path, row, record, data.prompt_field, str, "prompt")
        field(path, row, record, data.completion_field, str, "completion")
    else:
        messages = field(path, row, record, data.messages_field, list, "messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ValueError(
                f"data.path {path!r} row {row}: each message needs a string 'role' and 'content'"
            )
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(
                f"data.path {path!r} row {row}: no assistant message, so nothing to train on"
            )


def _check_prepared(path: str, spec: JobSpec, roots: Roots) -> None:
    _check_index(path, read_index(path, roots), spec)


def _check_index(path: str, index: object, spec: JobSpec) -> None:
    if not isinstance(index, dict):
        raise ValueError(f"data.path {path!r}: index.json is not an object; prepare it again")
    if index.get("seq_len") != spec.data.seq_len:
        raise ValueError(
            f"data.path {path!r} was prepared with seq_len {index.get('seq_len')}, the spec "
            f"says data.seq_len {spec.data.seq_len}; set data.seq_len: {index.get('seq_len')}"
        )


def _remote_refusals(spec: JobSpec, probes, tenant: str) -> list[tuple[tuple, str]]:
    url = spec.data.path or ""
    try:
        probes.call(tenant, lambda timeout_s: _check_remote(url, spec, timeout_s))
    except TimeoutError:
        return [
            (
                PATH,
                f"data.path {url}: the store did not answer within {probes.timeout_s:g} s "
                "(ETRAIN_PROBE_TIMEOUT_S); check data.path, the checkpoint section's "
                "endpoint_url and the network",
            )
        ]
    except ValueError as e:
        return [(PATH, str(e))]
    return []


def _check_remote(url: str, spec: JobSpec, timeout_s: float) -> None:
    """The checks of :func:`_check` on the head of object ``url`` (in a probe thread)."""
    from workers.storage.location import resolve_store
    from workers.storage.probe import quick_fs, redact_credentials

    loc = resolve_store(url.rstrip("/"), spec.stores)
    fs = quick_fs(loc, timeout_s)
    deadline = {"timeout": timeout_s} if getattr(fs, "async_impl", False) else {}
    source = spec.data.source
    try:
        if source == "prepared":
            raw = fs.cat_file(loc.join("index.json"), start=0, end=MAX_REMOTE_BYTES, **deadline)
            _check_index(url, json.loads(raw), spec)
        elif source == "parquet":
            _check_parquet_schema(url, fs, loc.root, spec)
        else:
            head = fs.cat_file(loc.root, start=0, end=MAX_REMOTE_BYTES + 1, **deadline)
            if source == "text":
                _check_text_head(url, head[:MAX_REMOTE_BYTES])
            else:
                _check_rows(url, _head_lines(url, head, MAX_REMOTE_BYTES), spec)
    except ValueError:
        raise
    except FileNotFoundError:
        what = "index.json" if source == "prepared" else "the object"
        raise ValueError(
            f"data.path {url!r} does not exist ({what} not found); name an object that does"
            + (" (a folder written by `etrain data prepare`)" if source == "prepared" else "")
        ) from None
    except Exception as e:  # noqa: BLE001 - any client error becomes the 422's reason
        why = redact_credentials(f"{type(e).__name__}: {e}", loc)
        raise ValueError(
            f"data.path {url!r}: cannot read it ({why}); check the object, the job's "
            "credentials and the checkpoint section's endpoint_url"
        ) from None


def _check_text_head(path: str, head: bytes) -> None:
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as e:
        raise ValueError(f"data.path {path!r}: not UTF-8 text ({e})") from e


def _wanted_columns(spec: JobSpec) -> list[tuple[str, str]]:
    """(column, the data option naming it) of each column the shape reads."""
    data = spec.data
    return {
        "text": [(data.text_field, "text_field")],
        "instruction": [
            (data.prompt_field, "prompt_field"),
            (data.completion_field, "completion_field"),
        ],
        "chat": [(data.messages_field, "messages_field")],
    }[data.shape]


def _check_parquet_schema(url: str, fs, path: str, spec: JobSpec) -> None:
    """The columns the shape reads exist (the footer only: row groups may be large)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open(path, "rb", block_size=MAX_REMOTE_BYTES) as f:
        try:
            names = pq.ParquetFile(f).schema_arrow.names
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"data.path {url!r}: not a readable parquet file ({e})") from e
    check_columns(url, names, _wanted_columns(spec))
