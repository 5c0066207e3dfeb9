"""Reading rows of the file formats people have: jsonl, parquet and plain text.

Every reader yields ``(row, record)`` pairs, ``row`` counted from 1 (a jsonl
file's line number), so that any error can name the file and the row, and the
spec field that named it (``section``: ``data`` or ``data.eval``). Plain
text is one document: the whole file. A path may be an object-store URL
(``s3://``, ``gs://``; ``stores`` maps it to its store as the spec says,
:mod:`workers.data.remote`): its rows are streamed (:mod:`workers.data.remote`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import IO

from workers.data import remote
from workers.storage.confine import ConfinementError, Roots, is_file, open_fd

FORMATS = ("text", "jsonl", "parquet")
# Parquet rows are read in batches of this many rows. Few: a row's size is not its size
# on disk (a 64 KiB string dictionary-encoded in 4,096 rows takes 81 bytes compressed), so
# 64 rows of 64 KiB are a 4 MiB batch where 4,096 were 256 MiB.
_PARQUET_BATCH = 64


@contextlib.contextmanager
def naming(section: str) -> Iterator[None]:
    """Re-raise a refusal of the check at use (:class:`ConfinementError`: a link out of the
    job's folders, a pipe, a device) as one that names ``section``'s path field first, so a
    job's error says which field of its spec named the file."""
    try:
        yield
    except ConfinementError as e:
        raise ConfinementError(f"{section}.path {e}") from None


def require_file(
    path: str | None,
    source: str,
    stores: remote.Stores | None = None,
    roots: Roots | None = None,
    *,
    section: str = "data",
) -> str:
    """``path`` if it is an existing file (or object); else a ValueError naming the spec
    section's path field (``section``: data or data.eval). A local one must be a regular
    file beneath ``roots`` (default: the job's)."""
    if not path:
        raise ValueError(f"{section}.path is required when {section}.source is {source!r}")
    if remote.is_remote(path):
        remote.file_info(path, stores, field=f"{section}.path")
        return path
    if path.startswith("file://"):
        path = path.removeprefix("file://")
    with naming(section):
        found = is_file(path, Roots.from_env() if roots is None else roots)
    if not found:
        raise ValueError(
            f"{section}.path {path!r} does not exist or is not a file; set {section}.path to "
            "a readable file"
        )
    return path


def open_binary(
    path: str,
    stores: remote.Stores | None = None,
    roots: Roots | None = None,
    *,
    section: str = "data",
) -> IO[bytes]:
    """``path`` opened for reading bytes: a streaming object-store file, or a local file
    opened beneath ``roots`` (default: the job's folders, :mod:`workers.storage.confine`);
    errors name ``section``'s path field."""
    if remote.is_remote(path):
        return remote.open_file(path, stores, field=f"{section}.path")
    roots = Roots.from_env() if roots is None else roots
    with naming(section):
        return os.fdopen(open_fd(path.removeprefix("file://"), roots), "rb")


def read_rows(
    path: str,
    source: str,
    stores: remote.Stores | None = None,
    *,
    roots: Roots | None = None,
    section: str = "data",
) -> Iterator[tuple[int, object]]:
    """``(row, record)`` pairs of ``path`` read as ``source`` (text, jsonl or parquet); a
    local file opened beneath ``roots`` (default: the job's); errors name ``section``'s
    fields (data or data.eval)."""
    if source not in FORMATS:
        raise ValueError(f"unknown {section}.source {source!r}; set one of: {', '.join(FORMATS)}")
    field_ = f"{section}.path"
    # Binary mode so a bad UTF-8 line is reported with its number, like bad JSON.
    with open_binary(path, stores, roots, section=section) as f:
        if source == "text":
            raw = f.read()
            try:
                yield 1, {"text": raw.decode("utf-8")}
            except UnicodeDecodeError as e:
                raise ValueError(f"{field_} {path!r}: not UTF-8 text ({e})") from e
        elif source == "jsonl":
            yield from jsonl_lines(path, f, section=section)
        else:
            yield from _parquet_rows(path, f, section=section)


def jsonl_lines(
    path: str, lines: Iterable[bytes], *, section: str = "data"
) -> Iterator[tuple[int, object]]:
    """``(line number, record)`` of JSON ``lines`` (blank ones skipped) read from ``path``,
    the file ``section``'s path field names."""
    where = f"{section}.path {path!r}"
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{where} line {lineno}: invalid JSON ({e})") from e
        except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
            raise ValueError(
                f"{where} line {lineno}: JSON nested too deeply to read (over "
                f"{sys.getrecursionlimit()} levels of [ or {{); a row is an object of strings "
                "(or a list of messages): fix or remove that line"
            ) from None
        yield lineno, record


def _parquet_file(path: str, f: IO[bytes], section: str):
    """``pyarrow.parquet.ParquetFile`` of ``f`` (its footer read); ValueError if it is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{section}.path {path!r}: not a readable parquet file ({e})") from e


def check_columns(
    path: str, names: Sequence[str], wanted: Sequence[tuple[str, str]], *, section: str = "data"
) -> None:
    """ValueError naming ``path`` and the option of ``section`` to set unless every
    ``(column, option)`` of ``wanted`` is in ``names``."""
    for name, option in wanted:
        if name not in names:
            raise ValueError(
                f"{section}.path {path!r}: no column {name!r} (columns: {', '.join(names)}); "
                f"set {section}.{option} to the column the file uses"
            )


def parquet_head(
    path: str,
    wanted: Sequence[tuple[str, str]],
    *,
    max_rows: int,
    max_bytes: int,
    roots: Roots | None = None,
    section: str = "data",
) -> Iterator[tuple[int, object]]:
    """The first rows (at most ``max_rows``) of the ``wanted`` columns of parquet file
    ``path``, read within about ``max_bytes`` of decoded data whatever the file holds.

    The footer comes first: a missing column is a ValueError naming the option to set
    (:func:`check_columns`), an empty file one saying so. Rows are read only from the
    first row group, only when its wanted columns take at most ``max_bytes`` uncompressed
    (column-chunk metadata), one row at a time, and only until the rows decoded so far
    take ``max_bytes`` (a dictionary-encoded value repeated in every row decodes to far
    more than its chunk's size); the rest is left to the workers, who read every row. A
    local file is opened beneath ``roots`` (default: the job's); errors name ``section``'s
    fields.
    """
    import pyarrow as pa

    with open_binary(path, roots=roots, section=section) as f:
        pf = _parquet_file(path, f, section)
        check_columns(path, pf.schema_arrow.names, wanted, section=section)
        meta = pf.metadata
        if meta.num_rows == 0:
            raise ValueError(f"{section}.path {path!r} holds no rows; it needs at least one")
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
            raise _unreadable_parquet(section, path, row, e) from e


def _unreadable_parquet(section: str, path: str, row: int, e: BaseException) -> ValueError:
    return ValueError(f"{section}.path {path!r} after row {row}: unreadable parquet ({e})")


def _parquet_rows(path: str, f: IO[bytes], *, section: str) -> Iterator[tuple[int, object]]:
    """Rows of parquet file object ``f`` in batches (an object store serves ranged reads)."""
    import pyarrow as pa

    pf = _parquet_file(path, f, section)
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH):
            for record in batch.to_pylist():
                row += 1
                yield row, record
    except (pa.ArrowException, OSError) as e:
        raise _unreadable_parquet(section, path, row, e) from e


def field(
    path: str,
    row: int,
    record: object,
    name: str,
    kind: type,
    what: str,
    *,
    section: str = "data",
):
    """``record[name]`` checked to be a ``kind``; else a ValueError naming file, row, field
    and the option of ``section`` (data or data.eval) to set."""
    where = f"{section}.path {path!r} row {row}"
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object with a {what} field {name!r}")
    if name not in record or record[name] is None:
        raise ValueError(
            f"{where}: no field {name!r}; rows need a {what} field (set "
            f"{section}.{_option(what)} to the field name the file uses)"
        )
    value = record[name]
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(
            {"str": "string", "list": "list"}.get(k.__name__, k.__name__) for k in kinds
        )
        raise ValueError(f"{where}: field {name!r} must be a {names}")
    return value


def _option(what: str) -> str:
    return f"{what}_field" if what in _OPTIONS else "messages_field"


_OPTIONS = ("text", "prompt", "completion", "chosen", "rejected")


def check_messages(messages: list, where: str, *, answer: bool = True) -> None:
    """A chat's messages are objects with a string role (and, when ``answer``, one of them
    an assistant's, which is what is trained on); else a ValueError at ``where``."""
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: each message needs a string 'role' and 'content'")
    if answer and not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message, so nothing to train on")


def preference_row(path: str, row: int, record: object, opts, *, section: str = "data"):
    """``(prompt, chosen, rejected)`` of a preference row (``opts``: its field names): three
    strings, or a prompt of chat messages and two answers, each a list of messages holding
    an assistant's (an answer given as one message object, or as a string, is that
    assistant message); else a ValueError naming file, row and field."""
    where = f"{section}.path {path!r} row {row}"
    prompt = field(path, row, record, opts.prompt_field, (str, list), "prompt", section=section)
    answers = []
    for what in ("chosen", "rejected"):
        name = getattr(opts, f"{what}_field")
        kind = str if isinstance(prompt, str) else (str, dict, list)
        answer = field(path, row, record, name, kind, what, section=section)
        if not isinstance(prompt, str):
            if isinstance(answer, str):
                answer = [{"role": "assistant", "content": answer}]
            answer = [answer] if isinstance(answer, dict) else answer
            check_messages(answer, f"{where} field {name!r}")
        answers.append(answer)
    if not isinstance(prompt, str):
        check_messages(prompt, f"{where} field {opts.prompt_field!r}", answer=False)
    return prompt, answers[0], answers[1]
