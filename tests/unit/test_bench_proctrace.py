"""bench/proctrace.py's arithmetic on samples (no processes: the samples are made here)."""

from __future__ import annotations

from bench.proctrace import Seen, busy_windows, process_rows


def _seen(pid, created, cpu, titles=()):
    s = Seen(pid, created)
    s.cpu = list(cpu)
    s.titles = list(titles)
    return s


def test_windows_count_each_process_from_its_start_or_first_sample():
    start = 100.0
    seen = {
        # Running long before the POST: only what it used after its first sample counts.
        1: _seen(1, 10.0, [(100.0, 50.0), (101.0, 50.5), (103.0, 51.5)]),
        # Started after the POST: all its CPU counts, from 0.
        2: _seen(2, 100.5, [(100.6, 0.4), (102.5, 1.9), (105.0, 3.9)]),
    }
    windows = busy_windows(seen, start, 105.0, width=2.0)
    assert windows == [(0.0, 0.5 + 0.4), (2.0, 1.0 + 1.5), (4.0, 2.0)]
    assert sum(c for _, c in windows) == (51.5 - 50.0) + 3.9


def test_rows_list_what_used_cpu_in_the_span_with_titles_in_turn():
    start = 100.0
    seen = {
        7: _seen(
            7,
            101.0,
            [(101.5, 0.5), (104.0, 2.5), (109.0, 4.0)],
            [(101.5, "python3.11"), (102.0, "ray::IDLE"), (103.9, "ray::TrainController")],
        ),
        8: _seen(8, 90.0, [(99.0, 1.0), (104.0, 1.01)], [(99.0, "raylet")]),  # idle then
    }
    rows = process_rows(seen, start, 104.0)
    assert len(rows) == 1
    assert rows[0].split()[:3] == ["1.00", "7", "2.50"]
    assert rows[0].endswith("python3.11@1.5 -> ray::IDLE@2.0 -> ray::TrainController@3.9")
