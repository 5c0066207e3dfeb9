"""Everything rank 0 writes besides the job's reporter, from ``spec.metrics``: TensorBoard
files (:mod:`.tensorboard`), the MLflow run (:mod:`.mlflow_sink`), the W&B run
(:mod:`.wandb_sink`), each a :class:`~workers.telemetry.sink.Sink` behind one tee."""

from __future__ import annotations

import logging

from workers.telemetry.mlflow_sink import MlflowSink
from workers.telemetry.sink import attach
from workers.telemetry.tensorboard import open_tensorboard
from workers.telemetry.tracking import run_id_for, spec_params
from workers.telemetry.wandb_sink import WandbSink

log = logging.getLogger(__name__)


def open_trackers(spec, env, exporter=None) -> list:
    """The experiment trackers' sinks of rank 0 (none elsewhere); one that cannot even be
    set up is logged and left out, never raised. ``exporter`` exports the final checkpoint
    for the trackers that log the model (``workers.checkpoint.export_final``)."""
    metrics = spec.metrics
    if env.rank != 0 or (metrics.mlflow is None and metrics.wandb is None):
        return []
    job_id = run_id_for(getattr(env.reporter, "job_id", None) or spec.name)
    common = {
        "job_id": job_id,
        "params": spec_params(spec),
        "reporter": env.reporter,
        "exporter": exporter,
    }
    makers = {
        "mlflow": lambda section: MlflowSink(section, **common),
        "wandb": lambda section: WandbSink(section, checkpoints=env.checkpoints, **common),
    }
    sinks = []
    for name, make in makers.items():
        section = getattr(metrics, name)
        if section is None:
            continue
        try:
            sinks.append(make(section))
        except Exception as e:  # noqa: BLE001 - a tracker is not worth failing the job over
            log.warning("%s: not tracking this run (%s: %s)", name, type(e).__name__, e)
    return sinks


def with_outputs(spec, env, *, start: int, exporter=None):
    """``(env, closer)``: ``env`` with its reporter behind a tee to every output
    ``spec.metrics`` asks for (on rank 0), and what closes them."""
    tensorboard = open_tensorboard(spec.metrics.tensorboard, env, start=start)
    return attach(env, [tensorboard, *open_trackers(spec, env, exporter)], step=start)
