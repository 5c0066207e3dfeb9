"""A job's start on real Ray: its parts are timestamped, and with warm spares on, the
driver prestarts the first group's worker processes before Ray Train asks for them."""

from __future__ import annotations

import uuid

import pytest

from service.backends.base import RunState
from tests.support.ray_cluster import submit_job, wait_for_job

pytestmark = pytest.mark.slow

ORDER = (
    "driver_process",
    "ray_connected",
    "driver_ready",
    "group_start",
    "actors_ready",
    "backend_ready",
    "train_fn",
)


@pytest.mark.parametrize("spares", [True, False], ids=["prestarted", "fresh"])
def test_the_start_is_timestamped_and_prestarted_workers_are_used(
    ray_head, ray_backend, telemetry_sink, tmp_path, spares
):
    job_id = f"j-start-{uuid.uuid4().hex[:6]}"
    spec = {
        "name": "start",
        "model": {"preset": "gpt-tiny"},
        "data": {"source": "synthetic", "seq_len": 16, "num_samples": 64},
        "resources": {"workers": 2},
        "train": {"steps": 1, "global_batch_size": 4, "micro_batch_size": 2},
        "checkpoint": {"storage": f"file://{tmp_path}", "every_steps": None},
        "failure": {"warm_spares": spares},
    }
    sid = submit_job(ray_backend, job_id=job_id, spec=spec, report_url=telemetry_sink.url)
    assert wait_for_job(ray_backend, sid, timeout=300) == RunState.SUCCEEDED
    started = [e for e in telemetry_sink.items("events", job_id) if e["kind"] == "workers_started"]
    assert len(started) == 1
    marks = started[0]["data"]["startup"]
    times = [marks[k] for k in ORDER] + [started[0]["ts"]]
    assert times == sorted(times), marks
    step1 = telemetry_sink.items("metrics", job_id)[0]
    assert step1["step"] == 1 and step1["ts"] >= started[0]["ts"]
    # Rank 0's process: prestarted by the driver right after it connected (so before
    # Ray Train's group asked for its actors), or started for the group. A process's start
    # time counts from /proc's boot time, in whole seconds: it reads up to 1 s early.
    if spares:
        assert marks["ray_connected"] - 1 <= marks["worker_process"] < marks["group_start"]
    else:
        assert marks["worker_process"] > marks["group_start"] - 1
    # Ray Train's actors of the run: none for Ray Datasets (etrain reads its own data)
    # and no preemption watcher (etrain reads no drain notice), each a process less.
    # (The first run on the cluster also creates Ray Data's autoscaling coordinator.)
    classes = run_actor_classes(ray_head.address, sid)
    assert {"TrainController", "PlacementGroupCleaner", "RayTrainWorker"} <= classes, classes
    assert not classes & {"DatasetManager", "PreemptionWatcher"}, classes


def run_actor_classes(address: str, submission_id: str) -> set[str]:
    """The classes of the actors the Ray job ``submission_id`` created."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    job_id = JobSubmissionClient(address).get_job_info(submission_id).job_id
    actors = list_actors(address=address, filters=[("job_id", "=", job_id)], limit=1000)
    return {a.class_name for a in actors}
