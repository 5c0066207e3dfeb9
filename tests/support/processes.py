"""Which local processes run a job, from the environment each process started with."""

from __future__ import annotations

import psutil

from service.backends.standby import SUBMISSION_PREFIX, runner_of
from workers.contract import JOB_ID_ENV, STANDBY_ID_ENV


def runs_job(env: dict[str, str], job: dict) -> bool:
    """Whether a process that started with ``env`` belongs to ``job`` (as the API shows it):
    started for it, or part of the standby driver's Ray job it was handed to (those got
    the job's variables later, which /proc does not show)."""
    if env.get(JOB_ID_ENV) == job["id"]:
        return True
    standby, recorded = env.get(STANDBY_ID_ENV), job.get("submission_id") or ""
    return bool(standby) and runner_of(recorded)[0] == SUBMISSION_PREFIX + standby


def job_processes(job: dict, *, cmdline_has: str = "") -> list[psutil.Process]:
    """Live processes of ``job`` whose command line contains ``cmdline_has``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if cmdline_has not in " ".join(p.info["cmdline"] or []):
            continue
        try:
            if runs_job(p.environ(), job):
                found.append(p)
        except psutil.Error:
            continue
    return found
