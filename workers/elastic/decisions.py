"""The scaling policy's decisions as values: Ray's, with what each has to say attached
(:mod:`workers.elastic.scaling` makes them, :class:`workers.elastic.callbacks.ScalingReports`
says it)."""

from __future__ import annotations

from dataclasses import dataclass

from workers.contract import EventKind
from workers.ray_compat import NoopDecision, ResizeDecision


@dataclass(frozen=True)
class Notice:
    """A job event a decision reports: its kind, text, data and ``dedup_key`` prefix."""

    kind: EventKind
    message: str
    data: dict
    dedup: str


@dataclass
class Resize(ResizeDecision):
    """Ray's resize decision, with the events and job-log lines that go with it."""

    notices: tuple[Notice, ...] = ()
    log_lines: tuple[str, ...] = ()


@dataclass
class Noop(NoopDecision):
    """Ray's no-op decision (keep training, or keep waiting), with what goes with it."""

    notices: tuple[Notice, ...] = ()
    log_lines: tuple[str, ...] = ()


Decision = Resize | Noop
