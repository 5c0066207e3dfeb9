"""A page of jobs with its total reads an index in order on SQLite: it never sorts the
tenant's jobs (a window total did, for every GET /v1/jobs)."""

from __future__ import annotations

import sqlalchemy as sa

from service.status import JobStatus
from service.store import Stores
from workers.spec import JobSpec

SPEC = JobSpec.model_validate({"name": "tiny", "resources": {"workers": 2}})


def _plans_of_pages(stores: Stores, **filters) -> list[list[str]]:
    """The query plan of each statement page_jobs runs with ``filters``."""
    engine = stores.jobs._db._engine
    ran: list[tuple[str, tuple]] = []

    def seen(conn, cursor, statement, params, context, executemany):
        ran.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        page, total = stores.jobs.page_jobs(limit=2, **filters)
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert len(page) == 2 and total == 3
    pages = [(s, p) for s, p in ran if "ORDER BY" in s]
    assert len(pages) == 1, ran  # the total rides on the page's statement
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        return [[row[-1] for row in raw.execute(f"EXPLAIN QUERY PLAN {s}", p)] for s, p in pages]


def test_a_tenants_page_and_its_total_read_indexes_without_a_sort(stores):
    assert stores.db.dialect == "sqlite"  # the store_url of tests/conftest.py
    tenant = stores.tokens.create_tenant("acme").id
    for i in range(3):
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1)
    for filters in ({}, {"statuses": [JobStatus.QUEUED, JobStatus.RUNNING]}):
        (plan,) = _plans_of_pages(stores, tenant_id=tenant, **filters)
        assert plan[0] == "SEARCH jobs USING INDEX ix_jobs_tenant_created (tenant_id=?)", plan
        assert "SCALAR SUBQUERY" in " ".join(plan), plan
        assert not [step for step in plan if "TEMP B-TREE" in step], plan
