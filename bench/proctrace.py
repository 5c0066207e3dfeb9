"""Which processes a job's start runs, when, and how busy they keep the cores.

A sampler thread reads the process tree under one root (``etrain serve``: its Ray head
and every driver and worker process Ray starts) every ``every`` seconds: each process's
title (Ray renames its worker processes by what they run: ``ray::IDLE``, then
``ray::TrainController.__init__`` ...) and its CPU time. From the samples:
:func:`busy_windows` (CPU seconds used per window against what the cores could give) and
:func:`process_rows` (per process: started, titles in turn, CPU used), both relative to
a job's submission. Used by ``startup.py --trace``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import psutil


@dataclass
class Seen:
    """One process over the samples: its start, titles in order (with when each was first
    seen), and its CPU seconds (user + system) at each sample."""

    pid: int
    created: float
    titles: list[tuple[float, str]] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)

    def cpu_at(self, t: float) -> float:
        """CPU seconds used up to the last sample at or before ``t``."""
        before = [c for s, c in self.cpu if s <= t]
        return before[-1] if before else 0.0


class ProcessSampler:
    """Samples the tree under ``root`` (not ``root`` itself) until stopped."""

    def __init__(self, root: int, every: float = 0.25):
        self.root, self.every = root, every
        self.seen: dict[int, Seen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proctrace", daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        """Read every process under the root once."""
        now = time.time()
        try:
            procs = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                with p.oneshot():
                    title, cpu, created = p.name(), p.cpu_times(), p.create_time()
            except psutil.Error:
                continue
            seen = self.seen.get(p.pid)
            if seen is None or seen.created != created:  # new, or its pid was reused
                seen = self.seen[p.pid] = Seen(p.pid, created)
            if not seen.titles or seen.titles[-1][1] != title:
                seen.titles.append((now, title))
            seen.cpu.append((now, cpu.user + cpu.system))


def busy_windows(
    seen: dict[int, Seen], start: float, end: float, width: float = 2.0
) -> list[tuple[float, float]]:
    """CPU seconds the sampled processes used in each ``width``-second window from
    ``start`` to ``end``: (window start relative to ``start``, CPU seconds). A process
    already running before ``start`` counts from its first sample, a new one from 0."""
    used: dict[int, float] = defaultdict(float)
    for s in (s for s in seen.values() if s.cpu):
        # Seen over a second after it started: it ran before, count from that first sample.
        last = s.cpu[0][1] if s.created < s.cpu[0][0] - 1 else 0.0
        for t, c in s.cpu:
            if start <= t <= end:
                used[int((t - start) // width)] += c - last
            last = c
    count = int((end - start) // width) + 1
    return [(i * width, used.get(i, 0.0)) for i in range(count)]


def process_rows(seen: dict[int, Seen], start: float, end: float) -> list[str]:
    """One line per process that ran between ``start`` and ``end`` and used CPU then:
    started (s after ``start``), pid, CPU seconds used in the span, titles in turn."""
    rows = []
    for s in sorted(seen.values(), key=lambda s: s.created):
        used = s.cpu_at(end) - s.cpu_at(start)
        if used < 0.05:
            continue
        titles = " -> ".join(f"{name}@{t - start:.1f}" for t, name in s.titles if t <= end)
        rows.append(f"{s.created - start:8.2f} {s.pid:>7} {used:8.2f}  {titles}")
    return rows


def print_trace(
    seen: dict[int, Seen], start: float, end: float, cores: int, width: float = 2.0
) -> None:
    """The windows and the processes of one job's start (``start``: its POST, ``end``:
    its first step visible)."""
    windows = busy_windows(seen, start, end, width)
    total = sum(c for _, c in windows)
    print(
        f"\nCPU used by the service's processes from the POST to the first step: {total:.1f} s"
        f" in {end - start:.1f} s on {cores} cores ({total / ((end - start) * cores):.0%});"
        f" per {width:g} s window (at most {width * cores:g}):"
    )
    print("  " + " ".join(f"{t:g}:{c:.1f}" for t, c in windows))
    least = total / cores  # every core busy all along, no process ever waiting
    print(f"  (the least time that CPU takes on {cores} cores: {least:.1f} s)")
    print(f"\n{'started':>8} {'pid':>7} {'CPU s':>8}  titles (s after the POST)")
    for row in process_rows(seen, start, end):
        print(row)


@dataclass(frozen=True)
class Census:
    """The processes of one tree at one moment: how many, their memory summed (PSS counts
    pages shared between them once; RSS counts them in each), and their titles."""

    processes: int
    pss_bytes: int
    rss_bytes: int
    titles: dict[str, int]


def census(root: int) -> Census:
    """``root`` and every process under it (``etrain serve``: its Ray head, drivers, workers
    and idle processes), now."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return Census(0, 0, 0, {})
    pss = rss = count = 0
    titles: dict[str, int] = defaultdict(int)
    for p in procs:
        try:
            info = p.memory_full_info()
            titles[p.name()] += 1
        except psutil.Error:
            continue
        count += 1
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
    return Census(count, pss, rss, dict(titles))
