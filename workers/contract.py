"""Every name that crosses a process boundary between the control plane and the cluster.

The service (which never imports torch) and the workers both import this
module, so each name below is defined exactly once:

- the environment a job driver is started with (``launch_env``) and the
  command that starts it (``driver_command``);
- the driver's exit codes, which the service's recovery policy reads;
- the names of the parallel strategies the workers ship;
- the telemetry protocol: the route the workers post to and one typed
  batch model (:class:`TelemetryBatch`) that the sender builds and the
  receiver validates, with the event kinds both sides use.

Imports nothing but pydantic and the standard library.
"""

from __future__ import annotations

import enum
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

# --- the cluster ---------------------------------------------------------------------------

# The Ray release the workers run on (pyproject pins it; KubeRay images and rayVersion use it).
RAY_VERSION = "2.60.0"

# --- the job driver ------------------------------------------------------------------------

DRIVER_MODULE = "workers.launch"
JOB_ID_ENV = "ETRAIN_JOB_ID"
JOB_SPEC_ENV = "ETRAIN_JOB_SPEC"  # the validated spec as JSON, checkpoint storage filled in
REPORT_URL_ENV = "ETRAIN_REPORT_URL"  # where telemetry goes (the service's public URL)
REPORT_TOKEN_ENV = "ETRAIN_REPORT_TOKEN"  # a token that may only report for this one job
# The Ray node ids a job's workers may run on (comma-separated): on a cluster whose GPU
# nodes differ in memory, those whose GPUs hold the job's ranks; unset: any node.
GPU_NODES_ENV = "ETRAIN_GPU_NODES"
# "module:function" returning the RunHooks a run installs (tests inject faults with it);
# read on the driver and on every worker. Unset in production.
RUN_HOOKS_ENV = "ETRAIN_RUN_HOOKS"
# Set (to "1") on Ray Train's worker actors and their warm spares; see workers.warm.spares.
WARM_WORKER_ENV = "ETRAIN_WARM_WORKER"
# In every etrain job's Ray job: Ray Train records its runs for the dashboard's Train run
# list (``service.backends.ray_jobs.TRAIN_RUNS_PATH``); off by default in Ray 2.60.
TRAIN_STATE_TRACKING_ENV = {"RAY_TRAIN_ENABLE_STATE_TRACKING": "1"}
# A standby driver (``workers.warm.standby``): a Ray job the service starts before any etrain
# job needs it, which warms up and then asks the service for its job at STANDBY_ROUTE.
STANDBY_ID_ENV = "ETRAIN_STANDBY_ID"
STANDBY_TOKEN_ENV = "ETRAIN_STANDBY_TOKEN"  # a token that may only fetch that standby's job
STANDBY_WORKERS_ENV = "ETRAIN_STANDBY_WORKERS"  # worker processes to warm on its node
STANDBY_ROUTE = "/v1/standby/{standby_id}/job"
# Where it says a job it ran succeeded; it then goes back to the pool for the next job.
STANDBY_DONE_ROUTE = "/v1/standby/{standby_id}/done"
# It runs job after job in one Ray job and prints these lines around each one (the job's
# submission id after them): the service cuts each job's log out of the Ray job's by them.
STANDBY_RUN_BEGIN = "etrain: standby driver: running "
STANDBY_RUN_END = "etrain: standby driver: done with "
# The driver exits with this when training itself failed (Ray Train already spent
# failure.max_failures restarts): resubmitting the job would only repeat the failure.
EXIT_TRAINING_FAILED = 3


def driver_command(python: str = "python") -> str:
    """The Ray job entrypoint that runs a job's driver with ``python``.

    ``exec``: the driver replaces Ray's shell, so a stop's SIGTERM reaches it (and
    it aborts the run cleanly) instead of the shell dying and taking it down.
    """
    return f"exec {shlex.quote(python)} -m {DRIVER_MODULE}"


def launch_env(*, job_id: str, spec_json: str) -> dict[str, str]:
    """The variables that tell a driver which job to run (the backend adds credentials)."""
    return {JOB_ID_ENV: job_id, JOB_SPEC_ENV: spec_json}


# The controller's job-log line as its wait for a joined node's warm spares ends with a resize
# (workers.elastic.scaling), as tests and bench/recovery.py read it: group 1, the seconds from
# the join to all ready; group 2 instead, the cap it waited without them all ready.
SPARES_WAIT_OVER = re.compile(
    r"'s warm spares (?:ready ([\d.]+) s after it joined|not all ready after ([\d.]+) s): resizing"
)


# --- parallel strategies -------------------------------------------------------------------

# What ``parallelism.strategy`` accepts; workers.strategies registers one ``apply_<name>``
# for each, and refuses to load if the two ever differ.
DDP, FSDP, TP, PP, HYBRID = "ddp", "fsdp", "tp", "pp", "hybrid"
DEEPSPEED = "deepspeed"  # DeepSpeed's ZeRO engine (the deepspeed extra)
STRATEGIES = (DDP, FSDP, TP, PP, HYBRID, DEEPSPEED)


# --- telemetry -----------------------------------------------------------------------------

TELEMETRY_ROUTE = "/v1/jobs/{job_id}/telemetry"


def telemetry_path(job_id: str) -> str:
    """The path a job's reporter posts its batches to."""
    return TELEMETRY_ROUTE.format(job_id=job_id)


class EventKind(str, enum.Enum):
    """Kinds of job events: the workers and the Ray Train controller report the first group,
    the service records the second; both sides read them (goodput, Prometheus, pages)."""

    # From the cluster (workers.train_loop, workers.checkpoint, workers.elastic).
    WORKERS_STARTED = "workers_started"
    RESTORED = "restored"
    MEMORY = "memory"
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    WORKER_FAILED = "worker_failed"
    RESIZED = "resized"
    LAYOUT_UNUSED = "layout_unused"
    WAITING = "waiting"
    EARLY_STOPPED = "early_stopped"
    TRACKING_FAILED = "tracking_failed"  # MLflow / W&B did not take what rank 0 sent
    # From the service (submission, scheduler, reconciler).
    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    REQUEUED = "requeued"
    STARTED = "started"
    RESUBMITTED = "resubmitted"
    CLUSTER_UNREACHABLE = "cluster_unreachable"  # the Ray cluster did not answer for a while
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class MetricPoint(BaseModel):
    """One training step as rank 0 measured it.

    Fields a newer worker adds beyond these are kept (and stored with the point),
    so the control plane never refuses telemetry for a metric it does not know yet.
    """

    model_config = ConfigDict(extra="allow")

    step: int = Field(description="Optimizer step (1-based).")
    world_size: int = Field(description="Workers in the group that ran the step.")
    ts: float | None = Field(None, description="Unix time the step ended.")
    loss: float | None = Field(None, description="Mean loss over the global batch.")
    lr: float | None = Field(None, description="Learning rate the step used.")
    grad_norm: float | None = Field(
        None, description="Global L2 norm of the step's gradients, before any clipping."
    )
    samples_per_s: float | None = Field(None, description="Global batch / step time.")
    tokens_per_s: float | None = Field(None, description="Tokens of the global batch / step time.")
    step_time_s: float | None = Field(None, description="Wall time of the step.")
    epoch: int | None = Field(None, description="Epoch of the sampler's cursor after the step.")
    epoch_position: int | None = Field(None, description="Samples of that epoch consumed.")
    epoch_size: int | None = Field(None, description="Samples per epoch.")
    eval_loss: float | None = Field(
        None,
        description="Mean loss over the held-out evaluation set's counted tokens, after "
        "this step (only on the steps that evaluate).",
    )
    eval_perplexity: float | None = Field(
        None, description="exp(eval_loss); unset when that overflows."
    )
    eval_s: float | None = Field(
        None, description="Wall time of the evaluation (not part of step_time_s)."
    )
    eval_samples: int | None = Field(None, description="Samples the evaluation read.")
    rewards_chosen: float | None = Field(
        None,
        description="objective dpo: mean over the step's pairs of beta x the chosen "
        "answer's log-probability ratio to the reference model.",
    )
    rewards_rejected: float | None = Field(
        None, description="objective dpo: the same for the rejected answer."
    )
    rewards_margin: float | None = Field(
        None, description="objective dpo: mean of rewards_chosen - rewards_rejected."
    )
    rewards_accuracy: float | None = Field(
        None, description="objective dpo: share of the step's pairs whose chosen reward is higher."
    )
    eval_step: int | None = Field(
        None,
        description="Set by the service on a job's latest metrics: the step eval_loss and "
        "eval_perplexity are from (the newest evaluation, kept past later steps).",
    )

    @model_serializer(mode="wrap")
    def _as_measured(self, handler: SerializerFunctionWrapHandler):
        # A point carries what was measured: a field nobody set is left out, not sent
        # (or stored, or served) as null.
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class TelemetryEvent(BaseModel):
    """A lifecycle event; ``dedup_key`` makes a replayed event count once."""

    kind: str = Field(description="An EventKind value (newer kinds are stored as they come).")
    message: str = Field(description="One line for people.")
    data: dict[str, Any] | None = Field(None, description="Details for programs.")
    dedup_key: str | None = Field(None, description="Unique per event; replays are ignored.")
    ts: float | None = Field(None, description="Unix time it happened.")


class CheckpointRecord(BaseModel):
    """A committed checkpoint, and the older ones its commit's retention deleted."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="Step the checkpoint holds.")
    uri: str = Field(description="Where it is (file://, s3://, gs://).")
    bytes: int = Field(description="Size of all its files.")
    save_s: float = Field(description="Seconds from the start of the save to its commit.")
    blocking_s: float | None = Field(None, description="Seconds training was held by the save.")
    eval_loss: float | None = Field(
        None, description="The held-out loss of its weights, when its step evaluated."
    )
    deleted_steps: list[int] = Field(
        default_factory=list,
        description="Committed checkpoints the retention rule deleted "
        "after this one committed (checkpoint.keep_last, keep_every, keep_best).",
    )


class TelemetryBatch(BaseModel):
    """What a job's reporter posts to :data:`TELEMETRY_ROUTE`; validated before anything
    is stored."""

    model_config = ConfigDict(extra="forbid")

    metrics: list[MetricPoint] = Field(default_factory=list)
    events: list[TelemetryEvent] = Field(default_factory=list)
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.metrics or self.events or self.checkpoints)

    def size(self) -> int:
        """Items in the batch."""
        return len(self.metrics) + len(self.events) + len(self.checkpoints)
