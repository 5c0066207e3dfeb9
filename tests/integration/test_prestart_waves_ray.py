"""Prestarting in waves on a real raylet (workers.warm.waves).

A raylet starts at most min(cores, node CPUs) worker processes at a time and drops
prestart requests beyond that; asked for in waves, every process starts. Both halves
run in one Ray job on the session's 2-CPU head, counted by the setup hook's marks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys, time
import ray
from workers.warm import spares as warm_spares, waves
from workers.ray_compat import prestart_workers, train_worker_runtime_env

ray.init(address=sys.argv[1], runtime_env=warm_spares.job_runtime_env())
started = warm_spares.spare_dir() / warm_spares.STARTED
started.mkdir(parents=True, exist_ok=True)
env = train_worker_runtime_env({})

def settle(want, timeout):
    deadline = time.monotonic() + timeout
    while waves.count_files(started) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return waves.count_files(started)

prestart_workers(5, keep_alive_s=120, runtime_env=env)  # all at once
at_once = settle(5, 15)
thread = warm_spares.prestart_waves([(5, env)])
if thread is not None:
    thread.join(120)
in_waves = settle(at_once + 5, 60) - at_once
print(json.dumps({"limit": waves.startup_concurrency(), "at_once": at_once, "in_waves": in_waves}))
"""


def _run_driver(script: str, address: str) -> dict:
    """Run ``script`` as a Ray job's driver on ``address``; its last line, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", script, address],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_raylet_drops_what_it_cannot_start_and_waves_start_it_all(ray_head):
    counts = _run_driver(SCRIPT, ray_head.gcs_address)
    assert counts["limit"] == min(2, os.cpu_count())  # the head has 2 CPUs
    assert counts["at_once"] == counts["limit"]  # 5 asked for, the rest dropped
    assert counts["in_waves"] == 5


READY_SCRIPT = """
import json, sys, time
import ray
import psutil
from workers.warm import spares as warm_spares, speculation
from workers.ray_compat import prestart_workers, train_worker_runtime_env

ray.init(address=sys.argv[1], runtime_env=warm_spares.job_runtime_env())
node = ray.get_runtime_context().get_node_id()
before = warm_spares.ready_on(node)
env = train_worker_runtime_env(warm_spares.worker_runtime_env())
folder = warm_spares.spare_dir()
# Another Ray job runs a job on this machine (its marker: this live process's pid), this
# one does not: the spares pause in their imports, holding no CPU, until it ends.
other = speculation.mark_busy("ffffffff")
try:
    prestart_workers(2, keep_alive_s=120, runtime_env=env)
    deadline = time.monotonic() + 60
    pids = []
    while len(pids) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = warm_spares.spares_in(folder, states=("warming",))
    time.sleep(1.0)  # past the import that was under way when they looked
    cpu0 = sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids)
    time.sleep(2.0)
    paused_cpu = sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids) - cpu0
    paused_ready = len(warm_spares.spares_in(folder))
finally:
    other.unlink()
deadline = time.monotonic() + 120
while len(warm_spares.spares_in(folder)) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
files = len(warm_spares.spares_in(folder))
counted = warm_spares.ready_on(node)
warm_spares.forget_ready()
print(json.dumps({"paused": len(pids), "paused_cpu": round(paused_cpu, 2),
                  "paused_ready": paused_ready, "before": before, "files": files,
                  "counted": counted,
                  "after": warm_spares.ready_on(node), "elsewhere": warm_spares.ready_on("x")}))
"""


def test_ready_spares_are_counted_through_the_gcs_and_pause_while_another_job_runs(ray_head):
    """What a controller on another node reads: each spare's key, once it imported the
    training stack; the driver drops them when the job ends. Spares started ahead pause
    while another Ray job runs a job on the machine and go on once it ended."""
    counts = _run_driver(READY_SCRIPT, ray_head.gcs_address)
    # While another job ran here, both spares stood still in their imports (speculation).
    assert counts.pop("paused") == 2 and counts.pop("paused_ready") == 0
    assert counts.pop("paused_cpu") < 0.3  # 2 processes, 2 s: next to nothing
    assert counts == {"before": 0, "files": 2, "counted": 2, "after": 0, "elsewhere": 0}
