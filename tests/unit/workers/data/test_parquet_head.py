"""Parquet is read within a byte bound, at submit and on the workers, whatever it holds.

The file of the cases: 4,096 rows of one 64 KiB string, dictionary-encoded and zstd-
compressed into a few hundred bytes, which decodes to 256 MiB. Memory is measured as
arrow's allocated bytes at every row the reader hands out (what it holds decoded at that
moment) and as the peak of Python's allocations (tracemalloc: the rows as Python objects).
"""

from __future__ import annotations

import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.domain import data_check
from service.domain.data_check import data_refusals
from workers.data.formats import read_rows
from workers.spec import JobSpec

ROWS, VALUE = 4096, "a" * 65536
MIB = 1 << 20


def bomb(path, column: str = "text") -> str:
    """A few hundred bytes on disk, 256 MiB decoded; built without decoding it here (no
    arrow schema stored, so it reads back as plain strings, as any writer's file does)."""
    values = pa.DictionaryArray.from_arrays(pa.array([0] * ROWS, pa.int32()), pa.array([VALUE]))
    pq.write_table(pa.table({column: values}), path, compression="zstd", store_schema=False)
    return str(path)


def spec(path: str, section: str = "data", **data) -> JobSpec:
    """A job reading parquet ``path`` as ``section`` (data.eval: beside synthetic data)."""
    source = {"source": "parquet", "path": path, **data}
    return JobSpec.model_validate(
        {
            "name": "p",
            "model": {"tokenizer": "/tokenizer"},  # only its presence is checked here
            "data": source if section == "data" else {"eval": source},
        }
    )


class Peaks:
    """Arrow's allocated bytes at each row seen, and tracemalloc's peak, around a block."""

    def __init__(self):
        self.arrow = 0
        self.python = 0

    def row(self) -> None:
        self.arrow = max(self.arrow, pa.total_allocated_bytes())

    def __enter__(self):
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        self.python = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def test_the_submit_check_of_a_decompression_bomb_stays_small(tmp_path, monkeypatch):
    path = bomb(tmp_path / "bomb.parquet")
    assert (tmp_path / "bomb.parquet").stat().st_size < 4096
    checked = []
    check_row = data_check._check_row

    def counting(path, row, record, spec):
        peaks.row()
        checked.append(row)
        check_row(path, row, record, spec)

    monkeypatch.setattr(data_check, "_check_row", counting)
    with Peaks() as peaks:
        assert data_refusals(spec(path)) == []
    # It read a whole 4,096-row batch: 256 MiB in arrow, as much again as Python strings.
    assert checked and peaks.arrow < 2 * data_check.MAX_PARQUET_BYTES, peaks.arrow
    assert peaks.python < 2 * data_check.MAX_PARQUET_BYTES, peaks.python
    assert len(checked) * len(VALUE) <= data_check.MAX_PARQUET_BYTES + len(VALUE)


def test_the_workers_read_a_decompression_bomb_in_small_batches(tmp_path):
    peaks, rows = Peaks(), 0
    for _, record in read_rows(bomb(tmp_path / "bomb.parquet"), "parquet"):
        peaks.row()
        rows += record["text"] == VALUE
    assert rows == ROWS
    assert peaks.arrow < 16 * MIB, peaks.arrow  # 64 rows a batch: 4 MiB, not 256


@pytest.mark.parametrize("section", ["data", "data.eval"])
def test_a_bomb_without_the_column_is_refused_naming_the_option(tmp_path, section):
    path = bomb(tmp_path / "bomb.parquet", column="body")
    ((field, why),) = data_refusals(spec(path, section))
    assert field == (*section.split("."), "path")
    assert why.startswith(f"{section}.path {path!r}: no column 'text' (columns: body)")
    assert f"set {section}.text_field" in why


@pytest.mark.parametrize("section", ["data", "data.eval"])
def test_rows_are_checked_within_the_byte_bound_only(tmp_path, monkeypatch, section):
    path = str(tmp_path / "rows.parquet")
    table = pa.table({"prompt": ["p", "q"], "completion": [None, "c"]})
    pq.write_table(table, path)
    ((_, why),) = data_refusals(spec(path, section, shape="instruction"))
    assert f"{section}.path {path!r} row 1: no field 'completion'" in why
    # The first row group is larger than the bound: its columns are checked, not its rows.
    monkeypatch.setattr(data_check, "MAX_PARQUET_BYTES", 16)
    assert data_refusals(spec(path, section, shape="instruction")) == []
    ((_, why),) = data_refusals(spec(path, section, shape="instruction", prompt_field="question"))
    assert "no column 'question'" in why and f"{section}.prompt_field" in why


@pytest.mark.parametrize("shape", ["text", "chat"])
def test_an_empty_file_is_refused(tmp_path, shape):
    path = str(tmp_path / "empty.parquet")
    column = "text" if shape == "text" else "messages"
    kind = pa.string() if shape == "text" else pa.list_(pa.struct([("role", pa.string())]))
    pq.write_table(pa.table({column: pa.array([], kind)}), path)
    ((_, why),) = data_refusals(spec(path, shape=shape))
    assert "holds no rows" in why


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "p", "chosen": "a"}, "row 1: no field 'rejected'"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, "row 1: field 'chosen' must be a string"),
        (
            {"prompt": [{"role": "user"}], "chosen": {"role": "user"}, "rejected": "b"},
            "row 1 field 'chosen': no assistant message",
        ),
    ],
)
def test_a_bad_preference_row_is_refused_at_submit_naming_file_and_row(tmp_path, row, message):
    import json

    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(row) + "\n")
    job = JobSpec.model_validate(
        {
            "name": "p",
            "objective": "dpo",
            "model": {"tokenizer": "/tokenizer"},
            "data": {"source": "jsonl", "path": str(path), "shape": "preference"},
        }
    )
    ((field, why),) = data_refusals(job)
    assert field == ("data", "path") and why.startswith(f"data.path {str(path)!r} {message}")


def test_a_preference_parquet_needs_its_three_columns(tmp_path):
    path = str(tmp_path / "prefs.parquet")
    pq.write_table(pa.table({"prompt": ["p"], "chosen": ["a"], "loser": ["b"]}), path)
    job = JobSpec.model_validate(
        {
            "name": "p",
            "objective": "dpo",
            "model": {"tokenizer": "/tokenizer"},
            "data": {"source": "parquet", "path": path, "shape": "preference"},
        }
    )
    ((_, why),) = data_refusals(job)
    assert "no column 'rejected'" in why and "data.rejected_field" in why
