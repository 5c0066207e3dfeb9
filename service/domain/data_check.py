"""Submit-time checks of a job's data, torch-free and bounded.

What can be told without tokenizing is checked before a job is queued: the
shape has what it needs (a tokenizer for instruction, chat and parquet; rows
with fields for instruction and chat), and, when the file is visible where the
service runs, that it parses and its first rows have the fields the shape
reads, or that a prepared folder's index matches the spec. Only the first
:data:`MAX_ROWS` rows (within :data:`MAX_JSONL_BYTES` of jsonl, :data:`MAX_TEXT_BYTES`
of plain text, parquet's first batch) are read, so a large file costs a bounded time;
the workers check every row when they tokenize.
A file the service cannot see (it may live on the workers only) is left to them.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os

from workers.data.formats import field, jsonl_lines, read_rows
from workers.spec import JobSpec

MAX_ROWS = 200
MAX_TEXT_BYTES = 1 << 20
MAX_JSONL_BYTES = 8 << 20
PATH = ("data", "path")


def data_refusals(spec: JobSpec) -> list[tuple[tuple, str]]:
    """(field path, why and what to do) for each problem of ``spec``'s data section."""
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
    path = (data.path or "").removeprefix("file://")
    if "://" in path or not os.path.exists(path):
        return []  # not visible here: the workers read it (and name it if it is missing)
    try:
        _check(path, spec)
    except (ValueError, OSError) as e:
        return [(PATH, str(e))]
    return []


def _check(path: str, spec: JobSpec) -> None:
    data = spec.data
    if data.source == "prepared":
        _check_prepared(path, spec)
        return
    if not os.path.isfile(path):
        raise ValueError(f"data.path {path!r} is not a file; name the data file")
    if data.source == "text":
        with open(path, "rb") as f:
            head = f.read(MAX_TEXT_BYTES)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        except UnicodeDecodeError as e:
            raise ValueError(f"data.path {path!r}: not UTF-8 text ({e})") from e
        return
    rows = itertools.islice(_head_rows(path, data.source), MAX_ROWS)
    seen = 0
    for row, record in rows:
        _check_row(path, row, record, spec)
        seen += 1
    if not seen:
        raise ValueError(f"data.path {path!r} holds no rows; it needs at least one")


def _head_rows(path: str, source: str):
    """The rows of the file's head: jsonl lines within :data:`MAX_JSONL_BYTES` (a line cut
    there is left to the workers), parquet's first batch."""
    if source != "jsonl":
        return read_rows(path, source)
    with open(path, "rb") as f:
        head = f.read(MAX_JSONL_BYTES + 1)
    lines = head[:MAX_JSONL_BYTES].split(b"\n")
    if len(head) > MAX_JSONL_BYTES:
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


def _check_prepared(path: str, spec: JobSpec) -> None:
    try:
        with open(os.path.join(path, "index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"data.path {path!r} is not a prepared folder (no readable index.json); write one "
            "with `etrain data prepare`"
        ) from e
    if index.get("seq_len") != spec.data.seq_len:
        raise ValueError(
            f"data.path {path!r} was prepared with seq_len {index.get('seq_len')}, the spec "
            f"says data.seq_len {spec.data.seq_len}; set data.seq_len: {index.get('seq_len')}"
        )
