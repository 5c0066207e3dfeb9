"""The names both sides of a job share (workers.contract), used by both sides."""

from __future__ import annotations

import shlex

import pytest
from pydantic import ValidationError

from workers import contract
from workers.contract import CheckpointRecord, EventKind, MetricPoint, TelemetryBatch


def test_the_driver_command_runs_the_driver_module_with_exec():
    command = contract.driver_command("/opt/venv/bin/python")
    assert command == "exec /opt/venv/bin/python -m workers.launch"
    assert shlex.split(contract.driver_command("/my venv/python"))[1] == "/my venv/python"
    import importlib

    assert importlib.util.find_spec(contract.DRIVER_MODULE) is not None


def test_launch_env_names_the_job_and_its_spec():
    env = contract.launch_env(job_id="j-1", spec_json='{"name": "x"}')
    assert env == {contract.JOB_ID_ENV: "j-1", contract.JOB_SPEC_ENV: '{"name": "x"}'}


def test_a_batch_round_trips_as_json_and_refuses_unknown_sections():
    batch = TelemetryBatch(
        metrics=[MetricPoint(step=3, world_size=2, loss=1.5, tokens_per_s=10.0)],
        checkpoints=[
            CheckpointRecord(step=3, uri="file:///c/3", bytes=10, save_s=0.1, deleted_steps=[1])
        ],
    )
    body = batch.model_dump(mode="json")
    assert TelemetryBatch.model_validate(body) == batch
    with pytest.raises(ValidationError, match="extra"):
        TelemetryBatch.model_validate({**body, "gauges": []})
    with pytest.raises(ValidationError, match="world_size"):
        TelemetryBatch.model_validate({"metrics": [{"step": 1}]})


def test_a_newer_metric_is_kept_not_refused():
    point = MetricPoint.model_validate({"step": 1, "world_size": 1, "mfu": 0.4})
    assert point.model_extra == {"mfu": 0.4} and point.model_dump()["mfu"] == 0.4


def test_event_kinds_are_their_wire_values():
    assert EventKind("worker_failed") is EventKind.WORKER_FAILED
    assert EventKind.RESIZED == "resized"
    assert len({k.value for k in EventKind}) == len(EventKind)


def test_the_telemetry_path_is_the_route_with_the_job_id():
    assert contract.telemetry_path("j-7") == "/v1/jobs/j-7/telemetry"
    assert contract.TELEMETRY_ROUTE.format(job_id="j-7") == contract.telemetry_path("j-7")
