"""Migration 0002: specs stored before the spec's ranges existed stay readable."""

from __future__ import annotations

import datetime as dt

from service.status import JobStatus
from service.store import Stores, migrate
from tests.support.old_database import database_at, job_row

NOW = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


def _job(job_id: str, status: str, resources: dict, **sections) -> dict:
    spec = {"name": job_id, "resources": resources, **sections}
    workers = resources["workers"]
    return job_row(
        job_id, spec, status=status, min_workers=workers if isinstance(workers, int) else 1, at=NOW
    )


def test_out_of_range_specs_are_moved_in_and_queued_ones_failed(tmp_path):
    url = database_at(
        tmp_path,
        "0001",
        [
            _job(
                "j-queued",
                "QUEUED",
                {"workers": 8192, "cpus_per_worker": 1e-300},
                train={"global_batch_size": 4 * 8192},
            ),
            _job(
                "j-done",
                "SUCCEEDED",
                {"workers": {"min": 8192, "max": 8192}},
                train={"global_batch_size": 4 * 8192},
            ),
            _job("j-seed", "SUCCEEDED", {"workers": 2}, train={"seed": 2**40}),
            _job("j-fine", "QUEUED", {"workers": 2}),
        ],
        at=NOW,
    )
    migrate(url)
    stores = Stores.open(url)
    try:
        queued = stores.jobs.get_job("j-queued")
        assert queued.status == JobStatus.FAILED
        assert "resources.workers" in queued.error and "cpus_per_worker" in queued.error
        assert queued.spec.resources.workers == 4096 and queued.min_workers == 4096
        assert queued.spec.resources.cpus_per_worker == 0.01
        done = stores.jobs.get_job("j-done")
        assert done.status == JobStatus.SUCCEEDED and done.spec.resources.max_workers == 4096
        assert stores.jobs.get_job("j-seed").spec.train.seed == 2**32 - 1
        fine = stores.jobs.get_job("j-fine")
        assert fine.status == JobStatus.QUEUED and fine.error is None
    finally:
        stores.close()
