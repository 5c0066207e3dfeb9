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
Each source is checked the same way, ``data`` and, when the spec has one, the
evaluation source ``data.eval``; a problem names the source's own fields.

Data on an object store (``s3://``, ``gs://``) is read through the submit path's
:class:`~service.domain.storage_check.StorageProbes` (a probe thread with short
timeouts and per-tenant bounds, never the event loop), with the job's store
options and the service's credentials, and only its head: :data:`MAX_REMOTE_BYTES`
of jsonl or text, a parquet file's schema (its footer; the rows are the workers'
to check), a prepared folder's ``index.json``. A store that does not answer within
the probe timeout is a 422 naming ``data.path`` (or ``data.eval.path``).
"""

from __future__ import annotations

import codecs
import itertools
import json
import os

from service.domain.image_check import check_image_rows
from workers.data.chat_template import is_template_file, read_template
from workers.data.formats import (
    check_columns,
    check_messages,
    field,
    jsonl_lines,
    parquet_head,
    preference_row,
)
from workers.data.images import image_rows
from workers.data.prepare import read_index
from workers.spec import DataSource, JobSpec
from workers.spec.base import field_loc
from workers.storage.confine import UNCONFINED, Roots, is_file, opened
from workers.storage.location import is_remote

MAX_ROWS = 200
MAX_TEXT_BYTES = 1 << 20
MAX_JSONL_BYTES = 8 << 20
MAX_REMOTE_BYTES = 1 << 20
# Decoded bytes of a parquet file's head the check reads, and the uncompressed size (from
# the footer) of the first row group's wanted columns above which it reads only the schema.
MAX_PARQUET_BYTES = 4 << 20


def sources(spec: JobSpec) -> list[DataSource]:
    """The data sections of ``spec`` that name samples: ``data`` (or each of its
    ``sources``), then ``data.eval``."""
    return spec.data.sections()


def path_loc(data: DataSource) -> tuple[str, ...]:
    """The field path of a section's ``path``: ("data", "path") or ("data", "eval", "path")."""
    return field_loc(f"{data.section}.path")


def data_refusals(
    spec: JobSpec, *, probes=None, tenant: str = "", roots: Roots = UNCONFINED
) -> list[tuple[tuple, str]]:
    """(field path, why and what to do) for each problem of ``spec``'s data sources (data,
    and data.eval when it is set); object-store data is read through ``probes`` (for
    ``tenant``), or left to the workers when there are none; a local file is opened beneath
    ``roots`` (the tenant's folders)."""
    out: list[tuple[tuple, str]] = []
    for data in sources(spec):
        out.extend(_source_refusals(spec, data, probes=probes, tenant=tenant, roots=roots))
    return out


def _template_refusals(data: DataSource, roots: Roots) -> list[tuple[tuple, str]]:
    """A chat template file the service can see that is too large, not UTF-8 or does not
    parse (in Jinja's sandbox), named by its field; the workers read it again at use."""
    path = data.chat_template
    if not is_template_file(path) or not os.path.exists(path):
        return []
    field = f"{data.section}.chat_template"
    try:
        read_template(path, field=field, roots=roots)
    except (ValueError, OSError) as e:
        return [(field_loc(field), str(e))]
    return []


def _source_refusals(
    spec: JobSpec, data: DataSource, *, probes, tenant: str, roots: Roots
) -> list[tuple[tuple, str]]:
    """:func:`data_refusals` of one source ``data`` (a section of ``spec``)."""
    template = _template_refusals(data, roots)
    return template or _rows_refusals(spec, data, probes=probes, tenant=tenant, roots=roots)


def _rows_refusals(
    spec: JobSpec, data: DataSource, *, probes, tenant: str, roots: Roots
) -> list[tuple[tuple, str]]:
    """The rows' side of :func:`_source_refusals`."""
    at = data.section
    tokenizer = spec.model.tokenizer or spec.model.hf
    if data.source == "synthetic":
        return []  # (a shape that reads fields is refused by the spec itself)
    needs_tokenizer = data.shape != "text" or data.source == "parquet"
    if data.source != "prepared" and tokenizer is None and needs_tokenizer:
        what = f"{at}.shape {data.shape}" if data.shape != "text" else f"{at}.source parquet"
        return [
            (
                ("model", "tokenizer"),
                f"{what} needs a tokenizer: set model.tokenizer (or model.hf) to a folder "
                "with tokenizer.json",
            )
        ]
    if is_remote(data.path):
        return [] if probes is None else _remote_refusals(spec, data, probes, tenant)
    path = (data.path or "").removeprefix("file://")
    if "://" in path or not os.path.exists(path):
        return []  # not visible here: the workers read it (and name it if it is missing)
    try:
        _check(path, data, roots)
        if data.shape == "image":  # the images and captions themselves
            rows = _parquet_rows(path, data, roots) if data.source == "parquet" else None
            rows = rows or _head_rows(path, roots, data.section)
            check_image_rows(path, rows, data, spec=spec, roots=roots)
    except (ValueError, OSError) as e:
        return [(path_loc(data), str(e))]
    return []


def _check(path: str, data: DataSource, roots: Roots) -> None:
    at = data.section
    if data.source == "prepared":
        _check_index(path, read_index(path, roots, section=at), data)
        return
    if not is_file(path, roots):
        raise ValueError(f"{at}.path {path!r} is not a file; name the data file")
    if data.source == "text":
        with opened(path, roots) as f:
            _check_text_head(path, f.read(MAX_TEXT_BYTES), at)
        return
    if data.source == "parquet":
        for row, record in _parquet_rows(path, data, roots):
            _check_row(path, row, record, data)
        return
    _check_rows(path, _head_rows(path, roots, at), data)


def _parquet_rows(path: str, data: DataSource, roots: Roots):
    """The rows of a parquet file's head (:func:`parquet_head`'s bounds)."""
    return parquet_head(
        path,
        _wanted_columns(data),
        max_rows=MAX_ROWS,
        max_bytes=MAX_PARQUET_BYTES,
        roots=roots,
        section=data.section,
    )


def _check_rows(path: str, rows, data: DataSource) -> None:
    rows = itertools.islice(rows, MAX_ROWS)
    seen = 0
    for row, record in rows:
        _check_row(path, row, record, data)
        seen += 1
    if not seen:
        raise ValueError(f"{data.section}.path {path!r} holds no rows; it needs at least one")


def _head_rows(path: str, roots: Roots, section: str):
    """The rows of a jsonl file's head: its lines within :data:`MAX_JSONL_BYTES` (a line
    cut there is left to the workers), read beneath ``roots``."""
    with opened(path, roots) as f:
        head = f.read(MAX_JSONL_BYTES + 1)
    return _head_lines(path, head, MAX_JSONL_BYTES, section)


def _head_lines(path: str, head: bytes, limit: int, section: str):
    """The JSON lines of ``head`` (a line cut at ``limit`` bytes is dropped)."""
    lines = head[:limit].split(b"\n")
    if len(head) > limit:
        lines = lines[:-1]
    return jsonl_lines(path, lines, section=section)


def _check_row(path: str, row: int, record: object, data: DataSource) -> None:
    at = data.section
    if data.shape == "text":
        field(path, row, record, data.text_field, str, "text", section=at)
    elif data.shape == "instruction":
        field(path, row, record, data.prompt_field, str, "prompt", section=at)
        field(path, row, record, data.completion_field, str, "completion", section=at)
    elif data.shape == "preference":
        preference_row(path, row, record, data, section=at)
    elif data.shape == "image":
        fields = {"image_field": data.image_field, "caption_field": data.caption_field}
        image_rows([(row, record)], path, section=at, **fields)
    else:
        messages = field(path, row, record, data.messages_field, list, "messages", section=at)
        check_messages(messages, f"{at}.path {path!r} row {row}")


def _check_index(path: str, index: object, data: DataSource) -> None:
    at = data.section
    if not isinstance(index, dict):
        raise ValueError(f"{at}.path {path!r}: index.json is not an object; prepare it again")
    # data.eval reads samples of data.seq_len (the spec copies it): the fix is the same.
    if index.get("seq_len") != data.seq_len:
        raise ValueError(
            f"{at}.path {path!r} was prepared with seq_len {index.get('seq_len')}, the spec "
            f"says data.seq_len {data.seq_len}; set data.seq_len: {index.get('seq_len')}"
        )


def _remote_refusals(
    spec: JobSpec, data: DataSource, probes, tenant: str
) -> list[tuple[tuple, str]]:
    url, at = data.path or "", data.section
    try:
        probes.call(tenant, lambda timeout_s: _check_remote(url, data, spec.stores, timeout_s))
    except TimeoutError:
        return [
            (
                path_loc(data),
                f"{at}.path {url}: the store did not answer within {probes.timeout_s:g} s "
                f"(ETRAIN_PROBE_TIMEOUT_S); check {at}.path, the stores section's "
                "endpoint_url and the network",
            )
        ]
    except ValueError as e:
        return [(path_loc(data), str(e))]
    return []


def _check_remote(url: str, data: DataSource, stores, timeout_s: float) -> None:
    """The checks of :func:`_check` on the head of object ``url`` (in a probe thread), the
    path of section ``data``, reached with the spec's ``stores``."""
    from workers.storage.location import resolve_store
    from workers.storage.probe import quick_fs, redact_credentials

    loc = resolve_store(url.rstrip("/"), stores)
    fs = quick_fs(loc, timeout_s)
    deadline = {"timeout": timeout_s} if getattr(fs, "async_impl", False) else {}
    source, at = data.source, data.section
    try:
        if source == "prepared":
            raw = fs.cat_file(loc.join("index.json"), start=0, end=MAX_REMOTE_BYTES, **deadline)
            _check_index(url, json.loads(raw), data)
        elif source == "parquet":
            _check_parquet_schema(url, fs, loc.root, data)
        else:
            head = fs.cat_file(loc.root, start=0, end=MAX_REMOTE_BYTES + 1, **deadline)
            if source == "text":
                _check_text_head(url, head[:MAX_REMOTE_BYTES], at)
            else:
                _check_rows(url, _head_lines(url, head, MAX_REMOTE_BYTES, at), data)
    except ValueError:
        raise
    except FileNotFoundError:
        what = "index.json" if source == "prepared" else "the object"
        raise ValueError(
            f"{at}.path {url!r} does not exist ({what} not found); name an object that does"
            + (" (a folder written by `etrain data prepare`)" if source == "prepared" else "")
        ) from None
    except Exception as e:  # noqa: BLE001 - any client error becomes the 422's reason
        why = redact_credentials(f"{type(e).__name__}: {e}", loc)
        raise ValueError(
            f"{at}.path {url!r}: cannot read it ({why}); check the object, the job's "
            "credentials and the stores section's endpoint_url"
        ) from None


def _check_text_head(path: str, head: bytes, section: str) -> None:
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as e:
        raise ValueError(f"{section}.path {path!r}: not UTF-8 text ({e})") from e


def _wanted_columns(data: DataSource) -> list[tuple[str, str]]:
    """(column, the data option naming it) of each column the shape reads."""
    return {
        "text": [(data.text_field, "text_field")],
        "instruction": [
            (data.prompt_field, "prompt_field"),
            (data.completion_field, "completion_field"),
        ],
        "chat": [(data.messages_field, "messages_field")],
        "preference": [
            (data.prompt_field, "prompt_field"),
            (data.chosen_field, "chosen_field"),
            (data.rejected_field, "rejected_field"),
        ],
        "image": [(data.image_field, "image_field"), (data.caption_field, "caption_field")],
    }[data.shape]


def _check_parquet_schema(url: str, fs, path: str, data: DataSource) -> None:
    """The columns the shape reads exist (the footer only: row groups may be large)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open(path, "rb", block_size=MAX_REMOTE_BYTES) as f:
        try:
            names = pq.ParquetFile(f).schema_arrow.names
        except (pa.ArrowException, OSError) as e:
            raise ValueError(
                f"{data.section}.path {url!r}: not a readable parquet file ({e})"
            ) from e
    check_columns(url, names, _wanted_columns(data), section=data.section)
