"""The scheduler's reads of the queue: every job in some statuses, oldest first.

The reconciler reads the whole queue at each tick, and a tick follows each burst of
submits. What it needs of a job (its tenant, its size, when it was submitted) never
changes once the job is stored, so only each job's id and status are read at each call;
the rest is read once per job, while the job stays in those statuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from sqlalchemy import func, select

from service.status import JobStatus
from service.store.database import Database
from service.store.job_pages import keyed_filter, status_values
from service.store.models import QueueEntry
from service.store.tables import JOBS, TENANTS

_ENTRY = select(
    JOBS.c.id,
    JOBS.c.tenant_id,
    func.coalesce(TENANTS.c.name, "").label("tenant"),
    JOBS.c.status,
    JOBS.c.min_workers,
    JOBS.c.spec[("resources", "cpus_per_worker")].as_float().label("cpus_per_worker"),
    JOBS.c.spec[("resources", "gpus_per_worker")].as_integer().label("gpus_per_worker"),
    JOBS.c.created_at,
).select_from(JOBS.outerjoin(TENANTS, TENANTS.c.id == JOBS.c.tenant_id))
# Each job's id and status, oldest first: the one statement read at every call.
_ORDER = keyed_filter(select(JOBS.c.id, JOBS.c.status), False, True).order_by(
    JOBS.c.created_at.asc(), JOBS.c.id.asc()
)
# Ids per statement when the entries of new jobs are read (well under SQLite's 32,766).
_IDS_PER_READ = 500


class QueueReads:
    """``list_queue`` of the ``jobs`` table, with the fixed part of each entry kept."""

    def __init__(self, db: Database):
        self._db = db
        # Per status set asked for: the entries returned last (the jobs still in it).
        self._kept: dict[frozenset[str], dict[str, QueueEntry]] = {}

    def list_queue(self, statuses: Iterable[JobStatus]) -> list[QueueEntry]:
        """Every job in ``statuses``, oldest first, with only what the scheduler needs."""
        values = frozenset(status_values(statuses) or ())
        with self._db.connect() as conn:
            rows = conn.execute(_ORDER, {"statuses": sorted(values)}).all()
            kept = self._kept.get(values, {})
            new = [job_id for job_id, _ in rows if job_id not in kept]
            read = dict(kept)
            for start in range(0, len(new), _IDS_PER_READ):
                chunk = _ENTRY.where(JOBS.c.id.in_(new[start : start + _IDS_PER_READ]))
                for row in conn.execute(chunk):
                    read[row.id] = QueueEntry(**{**row._mapping, "status": JobStatus(row.status)})
        entries = []
        for job_id, status in rows:
            entry = read.get(job_id)
            if entry is None:  # deleted between the two reads
                continue
            if entry.status.value != status:
                entry = dataclasses.replace(entry, status=JobStatus(status))
            entries.append(entry)
        self._kept[values] = {e.id: e for e in entries}
        return entries
