"""`make demo`: the main job on the embedded default, with a worker killed mid-run.

Starts `etrain serve` (which starts a local Ray head), submits
examples/gpt-tiny-ddp.yaml with `etrain submit --follow`, SIGKILLs one Ray
Train worker process a third of the way in, follows the job to SUCCEEDED
through the restart, prints the final loss, the checkpoint location and the
dashboard URL, and shuts everything down.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "gpt-tiny-ddp.yaml"
DATA_DIR = ROOT / ".etrain-demo"
PORT = int(os.environ.get("DEMO_PORT", "8800"))
URL = f"http://127.0.0.1:{PORT}"
BIN = Path(sys.executable).parent


def wait_ready(client: httpx.Client, serve: subprocess.Popen, timeout: float = 180) -> None:
    """Wait for /readyz (the embedded Ray head takes a few seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            sys.exit(f"demo: etrain serve exited with {serve.returncode}")
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit("demo: etrain serve did not become ready")


def train_workers() -> list[psutil.Process]:
    """Ray Train worker processes on this machine (their title starts with ray::RayTrainWorker)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::RayTrainWorker"):
            found.append(p)
    return found


def kill_one_worker(client: httpx.Client, total_steps: int, done: threading.Event) -> None:
    """Once the job passes a third of its steps, SIGKILL one training worker."""
    target = total_steps // 3 + 10  # just past the checkpoint at about a third
    while not done.is_set():
        items = client.get("/v1/jobs", params={"limit": 1}).json()["items"]
        if items and (items[0]["step"] or 0) >= target:
            workers = train_workers()
            if workers:
                victim = max(workers, key=lambda p: p.create_time())
                print(
                    f"\ndemo: step {items[0]['step']}: SIGKILL training worker pid {victim.pid}\n",
                    flush=True,
                )
                victim.send_signal(signal.SIGKILL)
                return
        time.sleep(0.3)


@contextlib.contextmanager
def serving(data_dir: Path, port: int, *, dashboard_port: str, gcs_port: str):
    """Run `etrain serve` (and so an embedded Ray head) on ``data_dir``; yield (process, env);
    stop both on the way out."""
    env = {
        **os.environ,
        "ETRAIN_DATA_DIR": str(data_dir),
        "ETRAIN_PORT": str(port),
        "ETRAIN_RAY_DASHBOARD_PORT": os.environ.get("DEMO_DASHBOARD_PORT", dashboard_port),
        "ETRAIN_RAY_GCS_PORT": os.environ.get("DEMO_GCS_PORT", gcs_port),
    }
    env.pop("ETRAIN_RAY_ADDRESS", None)
    # The child keeps its own copy of the log's descriptor; ours is closed after the start.
    with open(data_dir.with_suffix(".log"), "w") as log:
        serve = subprocess.Popen(
            [str(BIN / "etrain"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield serve, env
    finally:
        print("demo: stopping etrain serve and the embedded Ray head ...", flush=True)
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()


def submit_and_follow(spec: dict, name: str, data_dir: Path, url: str, serve, env: dict):
    """Wait for the service, submit ``spec`` (written to ``data_dir/name``) with `etrain
    submit --follow` as the admin; ``(job id, job, its metric points, the CLI's env)``."""
    with httpx.Client(base_url=url, timeout=60) as client:
        wait_ready(client, serve)
        token = (data_dir / "admin_token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        env = {**env, "ETRAIN_URL": url, "ETRAIN_TOKEN": token}
        filled = data_dir / name
        filled.write_text(yaml.safe_dump(spec))
        rc = subprocess.call([str(BIN / "etrain"), "submit", str(filled), "--follow"], env=env)
        if rc != 0:
            print(f"demo: etrain submit --follow exited with {rc}", file=sys.stderr)
        job_id = client.get("/v1/jobs", params={"limit": 1}).json()["items"][0]["id"]
        job = client.get(f"/v1/jobs/{job_id}").json()
        points = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    return job_id, job, points, env


def tune_and_export(
    spec_path: Path, folder: Path, data: Path, data_dir: Path, url: str, serve, env
):
    """Submit the fine-tuning spec at ``spec_path`` with ``model.hf`` = ``folder`` and
    ``data.path`` = ``data``, follow it to the end and export its adapter (`etrain export
    --adapter`) to ``data_dir/export/adapter``: ``(job id, job, metric points, adapter)``."""
    spec = yaml.safe_load(spec_path.read_text())
    spec["model"]["hf"], spec["data"]["path"] = str(folder), str(data)
    job_id, job, points, env = submit_and_follow(spec, spec_path.name, data_dir, url, serve, env)
    out = data_dir / "export" / "adapter"
    subprocess.run(
        [str(BIN / "etrain"), "export", job_id, "--adapter", "--out", str(out)],
        env=env,
        check=True,
    )
    return job_id, job, points, out


def main() -> int:
    """Run the demo end to end; exit non-zero unless the job succeeded after the restart."""
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    with serving(DATA_DIR, PORT, dashboard_port="8865", gcs_port="6390") as (serve, env):
        return run_job(serve, env)


def run_job(serve: subprocess.Popen, env: dict) -> int:
    """Submit, kill a worker mid-run, follow to the end and print the summary."""
    with httpx.Client(base_url=URL, timeout=30) as client:
        wait_ready(client, serve)
        token = (DATA_DIR / "admin_token").read_text().strip()
        client.headers["Authorization"] = f"Bearer {token}"
        env = {**env, "ETRAIN_URL": URL, "ETRAIN_TOKEN": token}
        import yaml

        steps = yaml.safe_load(SPEC.read_text())["train"]["steps"]
        done = threading.Event()
        killer = threading.Thread(target=kill_one_worker, args=(client, steps, done), daemon=True)
        killer.start()
        rc = subprocess.call([str(BIN / "etrain"), "submit", str(SPEC), "--follow"], env=env)
        done.set()
        job = client.get("/v1/jobs", params={"limit": 1}).json()["items"][0]
        events = client.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    print("\n=== demo summary ===")
    print(f"job          {job['id']}  {job['status']}  restarts={job['restarts']}")
    for e in events:
        if e["kind"] in ("worker_failed", "restored", "workers_started"):
            print(f"event        {e['kind']}: {e['message'][:120]}")
    print(f"final loss   {job['metrics']['loss']:.4f} at step {job['step']}")
    print(f"checkpoint   {ckpts[-1]['uri'] if ckpts else '(none)'}")
    print(f"dashboard    {job['dashboard_url']}")
    restarted = any(e["kind"] == "restored" for e in events)
    return 0 if rc == 0 and job["status"] == "SUCCEEDED" and restarted else 1


if __name__ == "__main__":
    sys.exit(main())
