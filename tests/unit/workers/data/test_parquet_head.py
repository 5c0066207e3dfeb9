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


def spec(path: str, **data) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "p",
            "model": {"tokenizer": "/tokenizer"},  # only its presence is checked here
            "data": {"source": "parquet", "path": path, **data},
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


def test_a_bomb_without_the_column_is_refused_naming_the_option(tmp_path):
    path = bomb(tmp_path / "bomb.parquet", column="body")
    ((field, why),) = data_refusals(spec(path))
    assert field == ("data", "path")
    assert "no column 'text' (columns: body)" in why and "set data.text_field" in why


def test_rows_are_checked_within_the_byte_bound_only(tmp_path, monkeypatch):
    path = str(tmp_path / "rows.parquet")
    table = pa.table({"prompt": ["p", "q"], "completion": [None, "c"]})
    pq.write_table(table, path)
    ((_, why),) = data_refusals(spec(path, shape="instruction"))
    assert "row 1: no field 'completion'" in why
    # The first row group is larger than the bound: its columns are checked, not its rows.
    monkeypatch.setattr(data_check, "MAX_PARQUET_BYTES", 16)
    assert data_refusals(spec(path, shape="instruction")) == []
    ((_, why),) = data_refusals(spec(path, shape="instruction", prompt_field="question"))
    assert "no column 'question'" in why and "data.prompt_field" in why


@pytest.mark.parametrize("shape", ["text", "chat"])
def test_an_empty_file_is_refused(tmp_path, shape):
    path = str(tmp_path / "empty.parquet")
    column = "text" if shape == "text" else "messages"
    kind = pa.string() if shape == "text" else pa.list_(pa.struct([("role", pa.string())]))
    pq.write_table(pa.table({column: pa.array([], kind)}), path)
    ((_, why),) = data_refusals(spec(path, shape=shape))
    assert "holds no rows" in why
