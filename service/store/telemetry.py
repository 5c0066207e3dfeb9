"""Per-step metrics and committed checkpoints, the two tables training telemetry fills."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, select, update

from service.errors import JobNotFound
from service.store.database import Database
from service.store.models import utcnow
from service.store.tables import CHECKPOINTS, JOBS, METRICS, require_job

# MetricPoint keys with a column of their own; the other keys of a point go into ``data``.
METRIC_COLUMNS = ("world_size", "loss", "lr", "samples_per_s", "tokens_per_s")
CHECKPOINT_UPDATES = ("uri", "bytes", "save_s", "blocking_s", "created_at", "eval_loss")
# The newest evaluation's results, carried on a job's latest metrics past later steps
# that do not evaluate, with ``eval_step``: the step they are from.
EVAL_CARRIED = ("eval_loss", "eval_perplexity")


def _to_datetime(ts: float | dt.datetime | None) -> dt.datetime:
    """Accept epoch seconds or a datetime (naive means UTC); None means now."""
    if ts is None:
        return utcnow()
    if isinstance(ts, dt.datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC)


def _metric_rows(job_id: str, points: list[dict]) -> list[dict]:
    """Turn reported points into job_metrics rows; the last point per step wins."""
    rows: dict[int, dict] = {}
    for point in points:
        extra = {k: v for k, v in point.items() if k not in ("step", "ts", *METRIC_COLUMNS)}
        row = {c: point.get(c) for c in METRIC_COLUMNS}
        step = int(point["step"])
        # PostgreSQL rejects one ON CONFLICT statement touching a row twice, so dedupe here.
        rows[step] = {
            **row,
            "job_id": job_id,
            "step": step,
            "ts": _to_datetime(point.get("ts")),
            "data": extra or None,
        }
    return list(rows.values())


def _metric_dict(row: dict, *, epoch: bool = False) -> dict:
    """Flatten a job_metrics row back into the reported shape (extras at top level)."""
    point = {**(row.get("data") or {}), "step": row["step"]}
    point["ts"] = row["ts"].timestamp() if epoch else row["ts"]
    for column in METRIC_COLUMNS:
        point[column] = row[column]
    return point


def _carry_eval(latest: dict, rows: list[dict], stored: dict | None) -> dict:
    """``latest`` with the newest evaluation's results: from the newest row of the batch
    that has them, else from the stored latest metrics. Left out when that evaluation is
    of a step after ``latest``'s (a restore rolled the job back past it)."""
    evaluated = [r for r in rows if (r["data"] or {}).get("eval_loss") is not None]
    if evaluated:
        row = max(evaluated, key=lambda r: (r["ts"], r["step"]))
        source, step = row["data"], row["step"]
    elif stored and stored.get("eval_loss") is not None:
        source, step = stored, stored.get("eval_step", stored.get("step"))
    else:
        return latest
    carried = {k: source[k] for k in EVAL_CARRIED if source.get(k) is not None}
    if not isinstance(step, int) or step > latest["step"]:
        return latest
    return {**latest, **carried, "eval_step": step}


class MetricStore:
    """The ``job_metrics`` and ``job_checkpoints`` tables. Every call is its own transaction."""

    def __init__(self, db: Database):
        """Use the tables of ``db``."""
        self._db = db

    def upsert_metrics(self, job_id: str, points: list[dict]) -> int:
        """Insert or replace per-step metrics; returns how many steps were written.

        Keys other than step, ts and METRIC_COLUMNS go into ``data``. The job's
        ``step`` and ``latest_metrics`` follow the newest point by time, so a
        restore that recomputes earlier steps moves progress back honestly, while a
        replayed old batch does not. ``latest_metrics`` keeps the newest evaluation's
        ``eval_loss`` and ``eval_perplexity`` (with ``eval_step``) past later points
        without one, until a restore goes back before that step.
        """
        rows = _metric_rows(job_id, points)
        if not rows:
            return 0
        query = self._db.insert(METRICS).values(rows)
        query = query.on_conflict_do_update(
            index_elements=["job_id", "step"],
            set_={c: query.excluded[c] for c in ("ts", *METRIC_COLUMNS, "data")},
        )
        newest = max(rows, key=lambda r: (r["ts"], r["step"]))
        latest = _metric_dict(newest, epoch=True)
        with self._db.begin() as conn:
            current = conn.execute(
                select(JOBS.c.latest_metrics).where(JOBS.c.id == job_id)
            ).one_or_none()
            if current is None:
                raise JobNotFound(f"no job {job_id!r}")
            conn.execute(query)
            stored = current.latest_metrics
            if stored is None or latest["ts"] >= float(stored.get("ts", 0.0)):
                latest = _carry_eval(latest, rows, stored)
                conn.execute(
                    update(JOBS)
                    .where(JOBS.c.id == job_id)
                    .values(step=newest["step"], latest_metrics=latest, updated_at=utcnow())
                )
        return len(rows)

    def list_metrics(self, job_id: str, *, after_step: int = -1, limit: int = 10000) -> list[dict]:
        """Return metric points with step > ``after_step``, ascending by step."""
        query = (
            select(METRICS)
            .where(METRICS.c.job_id == job_id, METRICS.c.step > after_step)
            .order_by(METRICS.c.step)
            .limit(limit)
        )
        with self._db.connect() as conn:
            return [_metric_dict(dict(row._mapping)) for row in conn.execute(query)]

    def upsert_checkpoint(
        self,
        job_id: str,
        *,
        step: int,
        uri: str,
        bytes: int,
        save_s: float,
        blocking_s: float | None = None,
        eval_loss: float | None = None,
    ) -> dict:
        """Record a committed checkpoint (with its step's held-out loss when it has one); a
        second one at the same step replaces it."""
        values = {
            "job_id": job_id,
            "step": step,
            "uri": uri,
            "bytes": bytes,
            "save_s": save_s,
            "blocking_s": blocking_s,
            "created_at": utcnow(),
            "eval_loss": eval_loss,
        }
        query = self._db.insert(CHECKPOINTS).values(values)
        query = query.on_conflict_do_update(
            index_elements=["job_id", "step"],
            set_={c: query.excluded[c] for c in CHECKPOINT_UPDATES},
        )
        with self._db.begin() as conn:
            require_job(conn, job_id)
            conn.execute(query)
        return values

    def list_checkpoints(self, job_id: str) -> list[dict]:
        """Return the job's checkpoints, ascending by step."""
        query = (
            select(CHECKPOINTS).where(CHECKPOINTS.c.job_id == job_id).order_by(CHECKPOINTS.c.step)
        )
        with self._db.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def delete_checkpoint(self, job_id: str, step: int) -> bool:
        """Forget the checkpoint at ``step``; False when there was none."""
        query = delete(CHECKPOINTS).where(
            CHECKPOINTS.c.job_id == job_id, CHECKPOINTS.c.step == step
        )
        with self._db.begin() as conn:
            return conn.execute(query).rowcount == 1
