"""The reconciler: admits queued jobs and follows submitted ones until they end."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from service.auth import ADMIN_TENANT, create_reporter_token
from service.backends.base import Backend, LaunchRequest, RunState, RunStatus
from service.domain.access_policy import AccessPolicy, Tenant
from service.domain.leadership import FencedJobs, Leadership, NotLeader
from service.domain.nvme_policy import nvme_env
from service.domain.queue_view import admission, pin_gpu_nodes
from service.domain.recovery import decide_recovery
from service.domain.scheduler import WaitCode, Waiting
from service.domain.states import change_status
from service.domain.storage_check import storage_launch_env
from service.domain.submit_backoff import SubmitBackoff
from service.errors import BackendError, BackendUnavailable
from service.settings.slices import ReconcilerSettings
from service.status import JobStatus
from service.store import JobRecord, Stores
from workers.contract import (
    REPORT_TOKEN_ENV,
    REPORT_URL_ENV,
    TRAIN_STATE_TRACKING_ENV,
    EventKind,
)

log = logging.getLogger(__name__)
ACTIVE = {JobStatus.PENDING, JobStatus.RUNNING}
# An active job gets a cluster_unreachable event once Ray has not answered for this long.
UNREACHABLE_EVENT_S = 5.0
# A woken tick starts WAKE_GAP_S and 1 / TICK_SHARE times the last tick's CPU after it began,
# at most a period: a tick reads the whole queue (40 ms for 2,000), a burst shares one.
WAKE_GAP_S, TICK_SHARE = 0.1, 0.1


def _now() -> datetime:
    return datetime.now(UTC)


# A job is starting from its admission to its first step, for at most this long.
STARTING_S = 60.0


def starting(job: JobRecord, now: datetime) -> bool:
    """Whether ``job`` was admitted and has not reported a step yet (within STARTING_S of
    its admission): its driver, controller and workers are starting."""
    if job.status not in ACTIVE or job.step > 0:
        return False
    since = job.started_at or job.updated_at
    return (now - since).total_seconds() < STARTING_S


class Reconciler:
    """One ``tick`` moves every job one step closer to what the cluster says."""

    def __init__(
        self,
        stores: Stores,
        backend: Backend,
        settings: ReconcilerSettings,
        *,
        leadership: Leadership | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Follow the jobs of ``stores`` on ``backend``; poll every ``settings.interval_s``
        while ``leadership`` says this replica leads (None: a single process, always), and
        write every job change fenced by its lease."""
        self.stores, self.backend, self.settings = stores, backend, settings
        self.policy = AccessPolicy(settings.policy)
        self.leadership = leadership or Leadership(None, ttl_s=settings.interval_s)
        self.jobs = FencedJobs(stores.jobs, self.leadership)
        self.backoff = SubmitBackoff(give_up_after_s=settings.submit_retry_s, clock=clock)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: tick now rather than at the end of the period
        self._thread: threading.Thread | None = None
        # submission id -> reporter token, kept across retries: a submit that timed out may
        # have reached Ray, and that driver keeps reporting with the token it was given.
        self._tokens: dict[str, str] = {}
        # job id -> the waiting reason last recorded, so a tick writes only what changed.
        self._waiting: dict[str, WaitCode] = {}
        self.clock = clock
        self.ticks, self.tick_cpu_s = 0, 0.0  # this process's, for /metrics
        self._down_since: float | None = None  # when the cluster stopped answering

    def tick(self) -> None:
        """Follow active jobs, then admit queued ones into the room that is left."""
        active = self.jobs.list_jobs_fifo(ACTIVE)
        if (lost := self.backend.head_lost()) is not None:
            self._head_lost(active, lost)
            try:
                self.backend.restart_head()
            except BackendUnavailable as e:
                log.warning("reconciler: the Ray head did not come back (next tick: again): %s", e)
                return
            active = self.jobs.list_jobs_fifo(ACTIVE)
        self._keep_standby(active)  # a standby started now still gains on a fresh start
        for job in active:
            try:
                self._follow(job)
            except BackendUnavailable as e:
                log.warning("reconciler: backend unavailable while following %s: %s", job.id, e)
                self._unreachable(active, e)
                return
        self._down_since = None
        self._admit()
        # After admission: replaces a standby a job just took, once that job is going.
        self._keep_standby(self.jobs.list_jobs_fifo(ACTIVE))

    def _unreachable(self, active: list[JobRecord], error: Exception) -> None:
        """Ray has not answered for UNREACHABLE_EVENT_S: one event per submitted job and
        outage. Its jobs are followed again once it answers (resubmitted if it lost them)."""
        now = self.clock()
        self._down_since = self._down_since if self._down_since is not None else now
        if now - self._down_since < UNREACHABLE_EVENT_S:
            return
        message = (
            f"the Ray cluster has not answered for {now - self._down_since:.0f}s "
            f"({_tail(str(error), 300)}); the job is followed again once it does"
        )
        outage = f"unreachable:{self._down_since:.0f}"
        self.stores.events.add_events(
            [
                (
                    job.id,
                    EventKind.CLUSTER_UNREACHABLE,
                    message,
                    None,
                    f"{outage}:{job.submission_id}",
                )
                for job in active
                if job.submission_id
            ]
        )

    def _head_lost(self, active: list[JobRecord], why: str) -> None:
        """The head is gone and every submitted job's driver and workers with it: each such
        job is resubmitted (from its newest checkpoint, once the head is back; it counts
        against ``failure.max_resubmits``) or, with none left, FAILED."""
        for job in active:
            if not job.submission_id:
                continue
            limit = job.spec.failure.max_resubmits
            missing = RunStatus(RunState.MISSING, why)
            decision = decide_recovery(
                missing, resubmits=job.resubmits, max_resubmits=limit, cause=why
            )
            if decision.resubmit:  # submitted once the head is back
                self._resubmit(job, decision.reason, submit=False)
            else:
                self._finish(job, JobStatus.FAILED, decision.reason)

    def _keep_standby(self, active: list[JobRecord]) -> None:
        """Start standby drivers, but not while a job is starting (:func:`starting`): a
        standby's warm-up takes the CPU that job's start needs."""
        now = _now()
        if not any(starting(job, now) for job in active):
            self.backend.keep_standby()

    def _admit(self) -> None:
        # A job the cluster turned away for now waits out its backoff in the queue.
        in_queue = self.jobs.list_queue({JobStatus.QUEUED})
        self.backoff.keep_only({e.id for e in in_queue})  # e.g. cancelled while waiting
        queued = [e for e in in_queue if self.backoff.due(e.id)]
        if not queued:
            return
        info, now = self.backend.cluster(), _now()
        active = self.jobs.list_queue(ACTIVE)
        decision = admission(queued, active, info, self.settings.quotas, now, self.jobs)
        for job_id in decision.admit:
            job = change_status(
                self.jobs,
                self.jobs.get_job(job_id),
                JobStatus.PENDING,
                event=(EventKind.ADMITTED, "admitted by the scheduler", None),
            )
            if job is not None:
                self._submit(job)
        self._record_waiting(decision.waiting)

    def _record_waiting(self, waiting: tuple[Waiting, ...]) -> None:
        """One ``waiting`` event per job and kind of reason (scheduler.WaitCode)."""
        self.stores.events.add_events(
            [
                (
                    w.job_id,
                    EventKind.WAITING,
                    w.reason,
                    {"reason": w.code.value},
                    f"waiting:{w.code}",
                )
                for w in waiting
                if self._waiting.get(w.job_id) != w.code
            ]
        )
        # Remembered once stored: a failed write is tried again next tick.
        self._waiting = {w.job_id: w.code for w in waiting}

    def _submit(self, job: JobRecord) -> None:
        """Hand a PENDING job to the backend (idempotent per submission id)."""
        submission_id = f"etrain-{job.id}-{job.resubmits}"
        token = self._tokens.get(submission_id) or create_reporter_token(
            self.stores.tokens, tenant_id=job.tenant_id, job_id=job.id
        )
        self._tokens[submission_id] = token
        tenant = getattr(self.stores.tokens.get_tenant(job.tenant_id), "name", None)
        req = LaunchRequest(
            job_id=job.id,
            submission_id=submission_id,
            spec_json=job.spec.model_dump_json(by_alias=True),
            tenant=tenant,
            env={
                **self._storage_env(job),
                **self._roots_env(tenant),
                **pin_gpu_nodes(self.backend, job, tenant),  # mixed GPUs: where its ranks fit
                REPORT_URL_ENV: self.settings.report_url,
                REPORT_TOKEN_ENV: token,
                **TRAIN_STATE_TRACKING_ENV,  # the dashboard's Train run list
            },
        )
        try:
            # A warm standby driver takes it if one is idle; its Ray job is the job's now.
            ray_id = self.backend.take_standby(req)
            if ray_id is None:
                ray_id, url = submission_id, self.backend.submit(req)
            else:
                url = self.backend.dashboard_links(ray_id).get("job", "")
        except BackendUnavailable as e:
            self._submit_failed(job, submission_id, e)
            return
        except BackendError as e:
            self._tokens.pop(submission_id, None)
            self.backoff.clear(job.id)
            self._finish(job, JobStatus.FAILED, f"submission refused: {e}")
            return
        self._tokens.pop(submission_id, None)
        self.backoff.clear(job.id)
        # Unsubmitted: a leader paused in this update may commit it after its successor's.
        updated = self.jobs.update_job(
            job.id,
            expect_status=JobStatus.PENDING,
            expect_unsubmitted=True,
            submission_id=ray_id,
            dashboard_url=url,
            event=(
                EventKind.SUBMITTED,
                f"submitted to Ray as {ray_id}",
                {"dashboard_url": url},
            ),
        )
        if updated is None and self.jobs.get_job(job.id).status == JobStatus.CANCELLED:
            self.backend.stop(ray_id)  # cancelled while we were submitting: do not leave it

    def _submit_failed(self, job: JobRecord, submission_id: str, error: Exception) -> None:
        """The cluster could not take the job now: back to the queue to be tried again after
        a backoff, or, once ``submit_retry_s`` is spent, FAILED with the last error."""
        why = _tail(str(error), 500)
        retry = self.backoff.failed(job.id)
        if retry is None:
            self._tokens.pop(submission_id, None)
            with contextlib.suppress(Exception):  # a try that timed out may have reached Ray
                self.backend.stop(submission_id)
            limit = f"{self.settings.submit_retry_s:g}s"
            self._finish(
                job, JobStatus.FAILED, f"the cluster did not accept the job within {limit}: {why}"
            )
            return
        tries, delay = retry
        change_status(
            self.jobs,
            job,
            JobStatus.QUEUED,
            event=(
                EventKind.REQUEUED,
                f"the cluster cannot take the job now (try {tries}); trying again in "
                f"{delay:g}s: {why}",
                {"tries": tries, "retry_in_s": delay},
            ),
        )

    def _roots_env(self, tenant: str | None) -> dict[str, str]:
        """The folders the job's processes may open (``ETRAIN_STORAGE_ROOTS``), from the
        access policy for its tenant: the workers confine every local open to them; and
        its NVMe swap area, where the operator enables one (``ETRAIN_NVME_ROOT``)."""
        who = Tenant(name=tenant or "", admin=tenant == ADMIN_TENANT)
        return {**self.policy.roots(who).env(), **nvme_env(self.policy.settings, who.name)}

    def _storage_env(self, job: JobRecord) -> dict[str, str]:
        """The object-store credentials the job's workers need, from the service's env.

        Not for KubeRay: a RayJob's runtime env is stored in the cluster in plain text, so
        its per-job pods take the same keys from the tenant's ``etrain-storage-<tenant>``
        Secret instead (``backends/kuberay.py``).
        """
        if not self.settings.storage_keys_in_env:
            return {}
        return storage_launch_env(job.spec)  # every store the spec names

    def _follow(self, job: JobRecord) -> None:
        """Move an active job to what its backend status says."""
        if not job.submission_id:
            self._submit(job)  # admitted, then the service stopped before submitting
            return
        status = self.backend.status(job.submission_id)
        if status.state == RunState.RUNNING and job.status == JobStatus.PENDING:
            change_status(
                self.jobs,
                job,
                JobStatus.RUNNING,
                started_at=job.started_at or _now(),
                event=(EventKind.STARTED, "job driver running on Ray", None),
            )
        elif status.state == RunState.SUCCEEDED:
            self._finish(job, JobStatus.SUCCEEDED, None)
            self.backend.settle(job.submission_id)  # a standby that ran it: the next one
        elif status.state in (RunState.FAILED, RunState.STOPPED, RunState.MISSING):
            decision = decide_recovery(
                status, resubmits=job.resubmits, max_resubmits=job.spec.failure.max_resubmits
            )
            if decision.resubmit:
                self._resubmit(job, decision.reason)
            else:
                self._finish(job, JobStatus.FAILED, _tail(status.message) or decision.reason)

    def _resubmit(self, job: JobRecord, reason: str, *, submit: bool = True) -> None:
        """Start the job again under a new submission id (now, or, with ``submit`` False,
        at the next tick); it resumes from its checkpoints."""
        updated = change_status(
            self.jobs,
            job,
            JobStatus.PENDING,
            resubmits=job.resubmits + 1,
            submission_id=None,
            event=(EventKind.RESUBMITTED, reason, {"previous_submission": job.submission_id}),
        )
        if updated is not None:  # not by a replica that no longer leads
            self.stores.tokens.revoke_job_tokens(job.id)
            if submit:
                self._submit(updated)

    def _finish(self, job: JobRecord, status: JobStatus, error: str | None) -> None:
        """Record how the job ended and revoke its reporter tokens."""
        kind = EventKind.SUCCEEDED if status == JobStatus.SUCCEEDED else EventKind.FAILED
        message = "training finished" if error is None else error
        event = (kind, message, None)
        if change_status(self.jobs, job, status, finished_at=_now(), error=error, event=event):
            self.stores.tokens.revoke_job_tokens(job.id)

    def start(self) -> None:
        """Run ``tick`` every ``reconcile_interval_s``, and on each :meth:`wake`, in a daemon
        thread."""
        self._thread = threading.Thread(target=self._loop, name="etrain-reconciler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tick soon (a job was queued): admission need not wait out the poll period. Wakes
        during a tick, or before the gap after it (``WAKE_GAP_S``), make one tick after."""
        self._wake.set()

    def _loop(self) -> None:
        earliest = 0.0  # monotonic time before which a woken tick waits
        while True:
            woken = self._wake.wait(self.settings.interval_s)
            if woken and (rest := earliest - time.monotonic()) > 0:
                self._stop.wait(rest)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self.leadership.leads():
                continue
            started, cpu = time.monotonic(), time.thread_time()
            try:
                self.tick()
            except NotLeader as e:
                log.info("reconciler: %s; the new leader goes on", e)
            except Exception:
                log.exception("reconciler tick failed; retrying next interval")
            spent = time.thread_time() - cpu
            self.ticks, self.tick_cpu_s = self.ticks + 1, self.tick_cpu_s + spent
            gap = max(WAKE_GAP_S, spent / TICK_SHARE)
            earliest = started + min(gap, self.settings.interval_s)

    def stop(self) -> None:
        """Stop the loop and wait for the current tick."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)


def _tail(message: str, limit: int = 2000) -> str:
    return message[-limit:] if message else ""
