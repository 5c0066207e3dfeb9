"""Goodput: the share of a job's wall time spent on training steps that counted.

``compute_goodput`` is pure: it reads a job's stored events, per-step metrics and
checkpoints and splits the wall time (created → finished, or → now while the job
runs) into productive time and where the rest went. Every part is derived from
stored timestamps as follows (times are clipped to the wall window):

- **waiting_s**: time QUEUED: from creation to the first ``admitted`` event, and
  from each ``requeued`` event to the next ``admitted`` (or to the end).
- **startup_s**: from the first admission to the start of the first step of the
  first run (the earliest stored step start, ``ts - step_time_s``, or the first
  ``workers_started`` event if earlier, since the first run's steps may have been
  recomputed and replaced), less any waiting inside it.
- **restart_restore_s**: from each interruption after the first step
  (``worker_failed``, ``resubmitted``, ``resized``) to the next run's first step:
  the earliest step start or ``workers_started`` event after it (workers announce
  themselves after loading the checkpoint). Overlapping windows count once, and
  waiting inside them (a requeued resubmission) counts as waiting.
- **recomputed_s**: work thrown away by each restore, priced at the median step
  time: the steps between the step a run restored from and the highest step the
  interrupted run reached. That high-water step is ``reported_step`` on the
  ``restored`` event when the ingest stamps it; otherwise the newest stored
  evidence from the interrupted run (its steps, its checkpoints, its own restore
  step) extrapolated by the median step time up to the interruption event, so it
  also absorbs the failure-detection delay.
- **checkpoint_blocking_s**: the training time each save blocked, one per
  ``checkpoint_saved`` event: the event's ``blocking_s``, else the stored
  checkpoint's, else the median of the known ones (retention deletes old rows),
  plus stored checkpoints no event mentions.
- **eval_s**: held-out evaluations, the sum of the stored points' ``eval_s``
  (each step once, its newest point). The train loop evaluates after it has timed
  the step, so this time is in no ``step_time_s``; a step's ``ts`` is its end,
  before the evaluation. Evaluations of steps whose point a restore has since
  replaced are no longer stored: their time stays in ``other_s``.
- **productive_s**: the sum of ``step_time_s`` over stored steps (each step once,
  by its newest point: recomputed ones by their latest run), less steps of an
  interrupted run that a restore has since rolled back. The train loop times a
  step before it evaluates or saves a checkpoint, so neither is inside step times.
- **other_s**: the remainder (teardown, telemetry lag, time between steps).

If clock skew or estimates make the parts exceed the wall time, each is cut to
what is left in this order: productive, waiting, startup, restart/restore,
checkpoint blocking, eval, recomputed; ``other_s`` is what remains, never negative.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from workers.contract import EventKind

INTERRUPTIONS = frozenset({EventKind.WORKER_FAILED, EventKind.RESUBMITTED, EventKind.RESIZED})
BREAKDOWN_KEYS = (
    "startup_s",
    "waiting_s",
    "checkpoint_blocking_s",
    "eval_s",
    "restart_restore_s",
    "recomputed_s",
    "other_s",
)
_CUT_ORDER = (
    "waiting_s",
    "startup_s",
    "restart_restore_s",
    "checkpoint_blocking_s",
    "eval_s",
    "recomputed_s",
)


@dataclass(frozen=True)
class Goodput:
    """Productive training time over wall time, and where the rest of the time went.

    ``productive_s`` plus the values of ``breakdown`` (keys ``BREAKDOWN_KEYS``)
    equal ``wall_s``; ``notes`` says which parts are estimates.
    """

    wall_s: float
    productive_s: float
    goodput: float
    breakdown: dict[str, float]
    steps: int
    recomputed_steps: int
    notes: tuple[str, ...] = ()


class _Event(NamedTuple):
    ts: float
    kind: str
    data: dict


class _Step(NamedTuple):
    step: int
    start: float
    end: float


def _epoch(value: datetime | float | int) -> float:
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.timestamp()
    return float(value)


def _events(events: Iterable[Any]) -> list[_Event]:
    """Stored events (EventRecord or mappings) in store order (by id)."""
    out = []
    for e in events:
        get = e.get if isinstance(e, dict) else lambda k, e=e: getattr(e, k)
        out.append(_Event(_epoch(get("ts")), get("kind"), get("data") or {}))
    return out


def _steps(metrics: Iterable[dict], notes: list[str]) -> tuple[list[_Step], float]:
    """Stored steps with their time spans, and the median step time (0 without any)."""
    points = [m for m in metrics if m.get("ts") is not None]
    known = [float(m["step_time_s"]) for m in points if m.get("step_time_s")]
    median = statistics.median(known) if known else 0.0
    if len(known) < len(points):
        notes.append(
            f"{len(points) - len(known)} step(s) report no step_time_s; "
            f"counted at the median {median:.3f} s"
        )
    steps = []
    for m in points:
        end = _epoch(m["ts"])
        dur = float(m["step_time_s"]) if m.get("step_time_s") else median
        steps.append(_Step(int(m["step"]), end - dur, end))
    return sorted(steps, key=lambda s: s.end), median


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _only(intervals: list[tuple[float, float]], taken: list[tuple[float, float]]) -> float:
    """Length of ``intervals`` outside ``taken``."""
    return _union(intervals + taken) - _union(taken)


def _queued(
    events: list[_Event], start: float, end: float, first: float | None
) -> list[tuple[float, float]]:
    """Intervals the job spent QUEUED (a never-admitted wait stops at the first step)."""
    spans, since = [], start
    for e in events:
        if e.kind == EventKind.ADMITTED and since is not None:
            spans.append((since, e.ts))
            since = None
        elif e.kind == EventKind.REQUEUED and since is None:
            since = e.ts
    if since is not None:
        spans.append((since, first if first is not None and first > since else end))
    return spans


def _next_run_start(t: float, events: list[_Event], steps: list[_Step], end: float) -> float:
    """When the first run after ``t`` took its first step (``end`` if none has)."""
    candidates = [s.start for s in steps if s.start >= t]
    candidates += [e.ts for e in events if e.kind == EventKind.WORKERS_STARTED and e.ts >= t]
    return min(candidates, default=end)


def _restart_windows(
    events: list[_Event], steps: list[_Step], first: float | None, end: float
) -> list[tuple[float, float]]:
    """Merged [interruption, next first step] windows after the first step."""
    if first is None:
        return []
    windows: list[tuple[float, float]] = []
    for e in sorted((e for e in events if e.kind in INTERRUPTIONS), key=lambda e: e.ts):
        if e.ts > first:
            w = (e.ts, _next_run_start(e.ts, events, steps, end))
            if windows and w[0] <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(windows[-1][1], w[1]))
            else:
                windows.append(w)
    return windows


def _restored_in(events: list[_Event], lo: float, hi: float) -> _Event | None:
    """The first ``restored`` event with ``lo <= ts < hi``."""
    return next((e for e in events if e.kind == EventKind.RESTORED and lo <= e.ts < hi), None)


def _high_water(
    run: tuple[float, float, int], events: list[_Event], steps: list[_Step], median: float
) -> int:
    """Highest step the run (start, interrupted at, restored-from step) reached, estimated."""
    start, cut, from_step = run
    evidence = [(start, from_step)]
    evidence += [(s.end, s.step) for s in steps if start <= s.end < cut]
    evidence += [
        (e.ts, int(e.data["step"]))
        for e in events
        if e.kind == EventKind.CHECKPOINT_SAVED and "step" in e.data and start <= e.ts < cut
    ]
    anchor_ts, anchor_step = max(evidence)
    extra = int((cut - anchor_ts) // median) if median > 0 else 0
    return max(max(step for _, step in evidence), anchor_step + extra)


def _rollbacks(
    events: list[_Event],
    steps: list[_Step],
    windows: list[tuple[float, float]],
    span: tuple[float, float],
    median: float,
    notes: list[str],
) -> tuple[int, set[_Step]]:
    """Steps thrown away by restores, and the stored steps among them (not yet redone).

    ``span`` is (first step start, end of the wall window); each window in
    ``windows`` ends where the next run took its first step (``span[1]`` if none).
    """
    (run_start, end), thrown, lost, estimated = span, 0, set(), 0
    run_from = _restored_in(events, float("-inf"), windows[0][0])
    for i, (cut, resumed) in enumerate(windows):
        following = windows[i + 1][0] if i + 1 < len(windows) else float("inf")
        restored = _restored_in(events, cut, following)
        if restored is not None or resumed < end:  # a run followed: what it redoes was lost
            new_from = int(restored.data.get("step", 0)) if restored else 0
            high = restored.data.get("reported_step") if restored else None
            if high is None:
                estimated += 1
                from_step = int(run_from.data.get("step", 0)) if run_from else 0
                high = _high_water((run_start, cut, from_step), events, steps, median)
            thrown += max(0, int(high) - new_from)
            lost |= {s for s in steps if run_start <= s.end < cut and new_from < s.step <= high}
        run_start, run_from = resumed, restored
    if estimated:
        notes.append(
            f"recomputed steps after {estimated} restore(s) estimated from "
            "timestamps (restored events carry no reported_step)"
        )
    return thrown, lost


def _one_per_step(metrics: Iterable[dict]) -> list[dict]:
    """The newest point (by ``ts``) of each step, so a replayed point counts once."""
    newest: dict[int, dict] = {}
    for m in metrics:
        step = int(m["step"])
        known = newest.get(step)
        if known is None or _epoch(m.get("ts") or 0) >= _epoch(known.get("ts") or 0):
            newest[step] = m
    return list(newest.values())


def _blocking(events: list[_Event], checkpoints: Sequence[dict], notes: list[str]) -> float:
    """Seconds checkpoint saves blocked training (see the module docstring)."""
    stored = {
        int(c["step"]): float(c["blocking_s"])
        for c in checkpoints
        if c.get("blocking_s") is not None
    }
    fallback = statistics.median(stored.values()) if stored else 0.0
    total, seen, guessed = 0.0, set(), 0
    for e in events:
        if e.kind != EventKind.CHECKPOINT_SAVED:
            continue
        step = e.data.get("step")
        seen.add(step)
        if e.data.get("blocking_s") is not None:
            total += float(e.data["blocking_s"])
        elif step in stored:
            total += stored[step]
        else:
            guessed += 1
            total += fallback
    total += sum(b for step, b in stored.items() if step not in seen)
    if guessed:
        notes.append(
            f"blocking of {guessed} save(s) no longer stored taken as the median {fallback:.3f} s"
        )
    return total


def compute_goodput(
    *,
    job: Any,
    events: Iterable[Any],
    metrics: Iterable[dict],
    checkpoints: Sequence[dict],
    now: datetime | float,
) -> Goodput:
    """Split a job's wall time into productive time and a breakdown of the rest.

    ``job`` needs ``created_at`` and ``finished_at`` (a JobRecord); ``events`` are
    EventRecords (or mappings with ts, kind, data) in store order; ``metrics``
    and ``checkpoints`` are what the store lists. A job that has not finished is
    measured up to ``now``. How each part is derived: see the module docstring.
    """
    notes: list[str] = []
    start = _epoch(job.created_at)
    end = max(start, _epoch(job.finished_at if job.finished_at is not None else now))
    evs = [e._replace(ts=min(max(e.ts, start), end)) for e in _events(events)]
    metrics = _one_per_step(metrics)
    steps, median = _steps(metrics, notes)
    starts = [s.start for s in steps] + [e.ts for e in evs if e.kind == EventKind.WORKERS_STARTED]
    first = min(starts) if starts else None
    queued = _queued(evs, start, end, first)
    admitted = next((e.ts for e in evs if e.kind == EventKind.ADMITTED), start)
    startup = [(admitted, first if first is not None else end)]
    windows = _restart_windows(evs, steps, first, end)
    thrown, lost = (
        _rollbacks(evs, steps, windows, (first, end), median, notes) if windows else (0, set())
    )
    parts = {
        "waiting_s": _union(queued),
        "startup_s": _only(startup, queued),
        "restart_restore_s": _only(windows, queued + startup),
        "checkpoint_blocking_s": _blocking(evs, checkpoints, notes),
        "eval_s": sum(float(m.get("eval_s") or 0.0) for m in metrics),
        "recomputed_s": thrown * median,
    }
    productive = sum(s.end - s.start for s in steps if s not in lost)
    return _assemble(
        end - start, productive, parts, steps=len(steps), recomputed=thrown, notes=tuple(notes)
    )


def _assemble(
    wall: float,
    productive: float,
    parts: dict[str, float],
    *,
    steps: int,
    recomputed: int,
    notes: tuple[str, ...],
) -> Goodput:
    """Cut the parts to fit ``wall`` (in ``_CUT_ORDER``) and put the rest in ``other_s``."""
    left = wall
    productive = min(max(productive, 0.0), left)
    left -= productive
    breakdown = {}
    for key in _CUT_ORDER:
        breakdown[key] = min(max(parts[key], 0.0), left)
        left -= breakdown[key]
    breakdown["other_s"] = max(left, 0.0)
    return Goodput(
        wall_s=wall,
        productive_s=productive,
        goodput=productive / wall if wall > 0 else 0.0,
        breakdown={k: breakdown[k] for k in BREAKDOWN_KEYS},
        steps=steps,
        recomputed_steps=recomputed,
        notes=notes,
    )
