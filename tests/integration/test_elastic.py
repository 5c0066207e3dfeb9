"""Elastic training on real Ray nodes: grow when a node joins, shrink when one is lost.

The session head has 2 CPUs; a second Ray node (2 CPUs) joins it from another network (a
namespace of its own, tests.support.netns) by ``etrain node join``, after a join with a
wrong token was refused; later its link is cut. The job asks for 2..4 workers, so it
starts at 2, grows to 4 and falls back to 2. Steps
are slowed down (tests.support.faults throttle file) while the test adds and removes
nodes: 2 s a step while it waits for the cluster, so the job cannot end before the nodes
come and go (about 60 s of throttled steps in a 40-step job: growing and shrinking take
about 25 s here), 0.2-0.5 s while it wants steps, then full speed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from service.backends.base import RunState
from tests.support.faults import fault_env
from tests.support.polling import wait_for
from tests.support.ray_cluster import join_node, submit_job, wait_for_job
from tests.support.telemetry_sink import TelemetrySink
from workers.contract import SPARES_WAIT_OVER, WARM_WORKER_ENV
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS, G = 40, 24  # 24 splits into micro-batches of 2 on 2, 3 or 4 workers
SAMPLES = 600  # 40 x 24 samples: one epoch and more
THROTTLE_S = 0.5  # a step while the test wants steps
WAITING_S = 2.0  # a step while the test waits for the cluster
CKPT_EVERY = 5


# The job runs DeepSpeed ZeRO-2, whose partitions change with the world size. Growing and
# shrinking on Ray is one path for every strategy (the group restarts from the newest
# checkpoint at its new size); what differs, the resharded restore, the local tables check
# for each strategy (test_strategies: checkpoints moved between sizes and layouts, a
# pipeline job growing in dp among them), and the sizes a layout can use, the scaling
# policy's unit tests (tests/unit/workers/elastic/test_scaling.py).
PARALLELISM = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}


def _spec(tmp_path) -> dict:
    return JobSpec.model_validate(
        {
            "name": "it-elastic",
            "parallelism": PARALLELISM,
            "data": {"seq_len": 32, "num_samples": SAMPLES},
            "resources": {"workers": {"min": 2, "max": 4}, "cpus_per_worker": 1},
            "train": {"steps": STEPS, "global_batch_size": G, "micro_batch_size": 2, "lr": 3e-3},
            "checkpoint": {"storage": f"file://{tmp_path}", "every_steps": CKPT_EVERY},
            "failure": {"max_failures": 5},
        }
    ).model_dump(mode="json", by_alias=True)


_FIXED: dict[int, dict[int, float]] = {}


def fixed_losses(spec: dict) -> dict[int, float]:
    """Every elastic job's reference: its spec (made by :func:`_spec`, which only the
    layout and ``train.steps`` vary) in one process, whose losses the layout does not
    change; computed once per step count."""
    steps = spec["train"]["steps"]
    if steps not in _FIXED:
        one = {**spec, "parallelism": {"strategy": "ddp"}, "resources": {"workers": 1}}
        env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False)
        _FIXED[steps] = run(JobSpec.model_validate(one), env).losses
    return _FIXED[steps]


def _pace(throttle: Path, seconds: float) -> None:
    """Every next step of the job sleeps ``seconds`` more (replaced at once, never half
    written)."""
    part = throttle.with_suffix(".part")
    part.write_text(str(seconds))
    part.replace(throttle)


def _submit(ray_backend, telemetry_sink, *, job_id: str, spec: dict, throttle: Path) -> None:
    _pace(throttle, THROTTLE_S)
    submit_job(
        ray_backend,
        job_id=job_id,
        spec=spec,
        report_url=telemetry_sink.url,
        env=fault_env(THROTTLE_FILE=throttle, THROTTLE_S=THROTTLE_S),
    )


def _warm_processes(pgid: int) -> list[psutil.Process]:
    """The worker-actor processes (Ray Train workers and their spares) of the node whose
    processes are in group ``pgid``, oldest first. Ray starts each worker in a session
    of its own: they are found as children of the node's raylet."""
    node = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid:
                node.add(proc.pid)
    found = []
    for proc in psutil.process_iter(["ppid", "create_time"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["ppid"] in node and proc.environ().get(WARM_WORKER_ENV) == "1":
                found.append(proc)
    return sorted(found, key=lambda p: (p.info["create_time"], p.pid))


def _is_train_worker(proc: psutil.Process) -> bool:
    try:
        return "RayTrainWorker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _token_file(tmp_path: Path) -> Path:
    """The session's Ray token as a file (a copy, as an operator hands one to a new node)."""
    if token := os.environ.get("RAY_AUTH_TOKEN"):
        path = tmp_path / "ray_auth_token"
        path.write_text(token)
        return path
    return Path(os.environ["RAY_AUTH_TOKEN_PATH"])


def _alive_ips(ray_backend) -> list[str]:
    return sorted(n["ip"] for n in ray_backend.cluster().nodes)


@pytest.fixture
def telemetry_sink(overlay):
    """A telemetry receiver the node in the overlay's namespace reaches too (any rank may
    land there, rank 0 with the metrics among them), at this machine's overlay address."""
    sink = TelemetrySink(host=overlay.host_ip)
    yield sink
    sink.close()
    assert sink.refused == []


def test_grows_and_shrinks_with_nodes_and_keeps_the_math(
    ray_backend, ray_head, overlay, telemetry_sink, tmp_path
):
    job_id = f"j-elastic-{uuid.uuid4().hex[:6]}"
    spec = _spec(tmp_path)
    throttle = tmp_path / "slow"
    # A node with the wrong token is refused (while the job starts): nothing runs there.
    wrong = tmp_path / "wrong_token"
    wrong.write_text("0" * 64)
    node = None
    refused = join_node(ray_head, overlay, cpus=2, token_file=wrong, log=tmp_path / "no.log")
    _submit(ray_backend, telemetry_sink, job_id=job_id, spec=spec, throttle=throttle)
    sizes = lambda: [m["world_size"] for m in telemetry_sink.items("metrics", job_id)]  # noqa: E731

    def detail() -> str:
        events = [(e["kind"], e["message"][:160]) for e in telemetry_sink.items("events", job_id)]
        steps = [(m["step"], m["world_size"]) for m in telemetry_sink.items("metrics", job_id)]
        logs = ray_backend.logs(f"it-{job_id}")[-2500:]
        node_log = (tmp_path / "node.log").read_text()[-1500:] if node else ""
        return f"events={events} last steps={steps[-8:]} logs={logs} node log={node_log}"

    wait_for(lambda: len(sizes()) >= 3, timeout=240, what="training at 2 workers")
    assert set(sizes()) == {2}
    assert refused.wait(120) != 0
    assert "Authentication token is missing or incorrect" in (tmp_path / "no.log").read_text()
    assert _alive_ips(ray_backend) == [overlay.host_ip] and overlay.pids() == []
    _pace(throttle, WAITING_S)
    node = join_node(
        ray_head, overlay, cpus=2, token_file=_token_file(tmp_path), log=tmp_path / "node.log"
    )
    try:
        wait_for(lambda: sizes()[-1] == 4, timeout=180, what="growing to 4 workers", detail=detail)
        both = sorted([overlay.host_ip, overlay.node_ip])  # the dashboard's view may lag
        wait_for(lambda: _alive_ips(ray_backend) == both, timeout=30, what="the node listed")
        # The new node's workers run in the spares asked for when it joined: the oldest
        # worker-actor processes there (fresh ones would start after the resize, and the
        # spares asked for after the grown group's first step later still).
        warm = _warm_processes(node.pid)
        workers = {p.pid for p in warm if _is_train_worker(p)}
        assert len(workers) == 2 and workers == {p.pid for p in warm[:2]}, (
            [(p.pid, p.info["create_time"], _is_train_worker(p)) for p in warm],
            detail(),
        )
        # ... and the resize waited for them: their readiness, which they record in the
        # GCS on that node, was read by the controller on the head. On a slow host the
        # wait may end at its cap instead (the spares still import): either way it ended.
        logs = ray_backend.logs(f"it-{job_id}")
        assert "joined: asked for 2 warm spare worker(s)" in logs
        assert "joined: resizing once its 2 warm spare(s) are ready" in logs, detail()
        assert SPARES_WAIT_OVER.search(logs), detail()
        grown_at = len(sizes())
        _pace(throttle, 0.2)
        wait_for(  # through a checkpoint that 4 ranks save
            lambda: len(sizes()) >= grown_at + CKPT_EVERY,
            timeout=180,
            what="training at 4 workers",
            detail=detail,
        )
        _pace(throttle, WAITING_S)
        overlay.cut()  # the node is lost: its link goes down, its processes run on
        shrunk_at = len(sizes())
        wait_for(
            lambda: len(sizes()) > shrunk_at and sizes()[-1] == 2,
            timeout=180,
            what="back at 2",
            detail=detail,
        )
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()
        overlay.mend()
    throttle.unlink()
    state = wait_for_job(ray_backend, f"it-{job_id}", timeout=400)
    assert state == RunState.SUCCEEDED, ray_backend.logs(f"it-{job_id}")[-3000:]

    metrics = {m["step"]: m for m in telemetry_sink.items("metrics", job_id)}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert metrics[STEPS]["world_size"] == 2, detail()
    events = telemetry_sink.items("events", job_id)
    resized = [e["message"] for e in events if e["kind"] == "resized"]
    assert "resized 2 → 4 (node added)" in resized and "resized 4 → 2 (node lost)" in resized
    # Exactly STEPS x G samples were consumed: the cursor is where one fixed run puts it.
    last = metrics[STEPS]
    assert (last["epoch"], last["epoch_position"]) == divmod(STEPS * G, SAMPLES)

    # The same spec at a fixed size: losses agree to fp32 reduction-order noise.
    fixed = fixed_losses(spec)
    for step, m in metrics.items():
        assert m["loss"] == pytest.approx(fixed[step], rel=1e-3), step
