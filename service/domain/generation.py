"""Text from a finished job's checkpoint (``POST /v1/jobs/{id}/generate``).

The control plane never imports torch, so each generation runs in a child process,
``python -m workers.generate``, which reads one request (the job's spec, the checkpoint's
URI, the prompt and sampling parameters) on stdin and answers one JSON line. The process
is the bound: it is killed at ``ETRAIN_GENERATE_TIMEOUT_S`` (loading included; decoding
itself stops a little before, so a slow model answers with what it has), its memory is
returned when it exits, and at most ``ETRAIN_GENERATE_CONCURRENCY`` run at once (one
more is a 429, not a queue). It runs with the job's tenant's folders as its roots
(``ETRAIN_STORAGE_ROOTS``, as the job's workers did: its model.hf and tokenizer are
opened beneath them), the job's object-store credentials and nothing else of the
service's environment; the checkpoint must be one the job reported, under the job's own
``<checkpoint.storage>/<job id>/checkpoints`` folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.auth import ADMIN_TENANT, Principal
from service.domain.access_policy import AccessPolicy, Tenant
from service.domain.queries import JobQueries
from service.domain.storage_check import storage_launch_env
from service.errors import EtrainError, InvalidSpec, QuotaExceeded
from service.settings.slices import GenerationSettings
from service.status import JobStatus
from service.store import JobRecord, Stores
from workers.generate.params import GenerateRequest, SamplingParams

# The repository (or site-packages) folder holding ``workers``: the child's import path.
CODE_ROOT = str(Path(__file__).resolve().parents[2])
# Variables of the service's environment the child keeps (no ETRAIN_*, no credentials).
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "PYTHONPATH")
_STEP_DIR = re.compile(r"step_\d+(\.[0-9a-f]+)?")
# Seconds of the time bound the decoding leaves for starting up and answering.
MARGIN_S = 2.0


class GenerationOff(EtrainError):
    """The operator turned generation off."""

    status_code = 403


class NotGeneratable(EtrainError):
    """The job cannot be generated from (yet): not finished, no checkpoint, one gone."""

    status_code = 409


class GenerationTimedOut(EtrainError):
    """The generating process ran past the time bound and was killed."""

    status_code = 504


class GenerationFailed(EtrainError):
    """The generating process failed."""

    status_code = 502


@dataclass(frozen=True)
class Prepared:
    """A checked request: the job, its chosen step, the child's request and environment."""

    job_id: str
    step: int
    request: GenerateRequest
    env: dict[str, str]


# (request, environment, timeout) -> (exit status, stdout): how a request is run.
Runner = Callable[[GenerateRequest, dict[str, str], float], tuple[int, str]]


def run_process(request: GenerateRequest, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """Run ``python -m workers.generate`` on ``request``; killed at ``timeout_s``."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.generate"],
        input=request.model_dump_json(),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    return done.returncode, done.stdout


def pick_step(checkpoints: list[dict], step: int | None, job_id: str) -> dict:
    """The checkpoint at ``step``; by default the one marked best, else the newest."""
    if not checkpoints:
        raise NotGeneratable(
            f"job {job_id} has no committed checkpoint to generate from "
            "(checkpoint.every_steps saves them)"
        )
    if step is None:
        best = [c for c in checkpoints if c.get("best")]
        return best[0] if best else max(checkpoints, key=lambda c: c["step"])
    chosen = [c for c in checkpoints if c["step"] == step]
    if not chosen:
        steps = ", ".join(str(c["step"]) for c in sorted(checkpoints, key=lambda c: c["step"]))
        msg = f"job {job_id} has no checkpoint at step {step}; available steps: {steps}"
        raise InvalidSpec(msg, [{"loc": ["body", "step"], "msg": msg, "type": "value_error"}])
    return chosen[0]


def confined_uri(job: JobRecord, uri: str) -> str:
    """``uri`` if it is a step folder in the job's own checkpoints folder, else 409."""
    root = f"{(job.spec.checkpoint.storage or '').rstrip('/')}/{job.id}/checkpoints"
    head, _, name = uri.rstrip("/").rpartition("/")
    ok = head == root and _STEP_DIR.fullmatch(name) is not None
    if ok and root.startswith("file://"):  # and no link leads out of it
        real_root = os.path.realpath(root.removeprefix("file://"))
        ok = os.path.realpath(uri.removeprefix("file://")) == os.path.join(real_root, name)
    if not ok:
        raise NotGeneratable(
            f"checkpoint {uri} of job {job.id} is not in the job's checkpoints folder {root}; "
            "generation reads only that folder"
        )
    return uri


class Generation:
    """Generation requests: checked here, run in a bounded child process."""

    def __init__(
        self,
        stores: Stores,
        queries: JobQueries,
        settings: GenerationSettings,
        runner: Runner = run_process,
    ):
        """Jobs and checkpoints read through ``queries`` (scoped to the caller's tenant)."""
        self.stores, self.queries, self.settings, self.runner = stores, queries, settings, runner
        self.policy = AccessPolicy(settings.policy)
        self._slots = threading.BoundedSemaphore(settings.concurrency)

    def prepare(
        self, principal: Principal, job_id: str, params: SamplingParams, step: int | None
    ) -> Prepared:
        """Check the request (the store is read here: call it off the event loop)."""
        if not self.settings.enabled:
            raise GenerationOff(
                "generation is turned off on this service (ETRAIN_GENERATE_ENABLED); export "
                "the model with etrain export, or run etrain generate JOB where its "
                "checkpoint storage is mounted"
            )
        job = self.queries.get(principal, job_id)  # another tenant's job: 404
        bound = self.settings.max_new_tokens
        if params.new_tokens(bound) > bound:
            msg = f"max_new_tokens is {params.max_new_tokens}; this service allows at most {bound}"
            errors = [{"loc": ["body", "max_new_tokens"], "msg": msg, "type": "less_than_equal"}]
            raise InvalidSpec(msg, errors)
        if job.status != JobStatus.SUCCEEDED:
            raise NotGeneratable(
                f"job {job_id} is {job.status.value}; generation reads a SUCCEEDED job's "
                "checkpoint (wait for it to finish)"
            )
        chosen = pick_step(self.queries.checkpoints(principal, job_id), step, job_id)
        request = GenerateRequest(
            **params.model_dump(exclude={"max_new_tokens"}),
            max_new_tokens=params.new_tokens(bound),
            spec=job.spec.model_dump(mode="json", by_alias=True),
            checkpoint_uri=confined_uri(job, chosen["uri"]),
            timeout_s=max(self.settings.timeout_s - MARGIN_S, 1.0),
        )
        return Prepared(job.id, int(chosen["step"]), request, self._env(job))

    def _env(self, job: JobRecord) -> dict[str, str]:
        """The child's environment: a few basics, the job's roots and store credentials."""
        tenant = getattr(self.stores.tokens.get_tenant(job.tenant_id), "name", None) or ""
        roots = self.policy.roots(Tenant(name=tenant, admin=tenant == ADMIN_TENANT))
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        path = [CODE_ROOT, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        return {
            **env,
            "PYTHONPATH": os.pathsep.join(path),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **roots.env(),
            **storage_launch_env(job.spec),
        }

    def run(self, prepared: Prepared) -> dict[str, Any]:
        """Generate (blocks for up to the time bound: call it off the event loop)."""
        if not self._slots.acquire(blocking=False):
            raise QuotaExceeded(
                f"{self.settings.concurrency} generation(s) already running, the service's "
                "limit (ETRAIN_GENERATE_CONCURRENCY); try again when one has finished"
            )
        try:
            code, out = self.runner(prepared.request, prepared.env, self.settings.timeout_s)
        except subprocess.TimeoutExpired:
            raise GenerationTimedOut(
                f"generation from job {prepared.job_id} took longer than "
                f"{self.settings.timeout_s:g}s (ETRAIN_GENERATE_TIMEOUT_S) and was stopped; "
                "ask for fewer tokens"
            ) from None
        finally:
            self._slots.release()
        return self._answer(prepared, code, out)

    @staticmethod
    def _answer(prepared: Prepared, code: int, out: str) -> dict[str, Any]:
        lines = out.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        where = f"job {prepared.job_id} step {prepared.step}"
        if code == 0 and "tokens" in answer:
            return {"job_id": prepared.job_id, "step": prepared.step, **answer}
        if code == 2 and "error" in answer:
            raise NotGeneratable(f"cannot generate from {where}: {answer['error']}")
        why = answer.get("error") or f"the generating process exited with status {code}"
        raise GenerationFailed(f"generation from {where} failed: {why}")
