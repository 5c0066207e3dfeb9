"""Leader failover of the control plane: how long the scheduler and reconciler are without a
leader when the leading replica is killed or paused, and how soon a job submitted in that
gap is admitted. Prints one row per case (median, min and max of ``--rounds``).

    .venv/bin/python bench/failover.py                          # 3 replicas, lease 10 s
    .venv/bin/python bench/failover.py --replicas 2 --lease 2 --rounds 5

The replicas are the app (real store, scheduler, reconciler and leader election) on
``tests/support/fakes.FakeBackend`` (4 CPUs, no Ray job), each in its own process, on
one PostgreSQL database: ``ETRAIN_TEST_POSTGRES_URL`` (or ``--database``), else a server
the bench starts from the ``pgserver`` wheel. In each round the leader is SIGKILLed (a
replacement replica is started after), or SIGSTOPped until another leads and then
resumed (it must say it follows). A job is submitted to a follower right after the
signal; "admitted" is from the signal to the job leaving the queue, through the new
leader (it is woken by PostgreSQL NOTIFY from the follower that stored it, or by its
election).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_load import _free_port  # noqa: E402 - after the path is set

SPEC = {
    "name": "failover",
    "resources": {"workers": 1, "cpus_per_worker": 0.01},
    "train": {"steps": 5, "global_batch_size": 4, "micro_batch_size": 4},
}


def serve_fake(port: int, data_dir: str, database: str, lease: float) -> None:
    """One replica: the app on FakeBackend with the shared database and lease."""
    import uvicorn

    from service.api.app import create_app
    from tests.support.fakes import FakeBackend, dev_settings

    settings = dev_settings(Path(data_dir), database_url=database, leader_lease_s=lease, port=port)
    app = create_app(settings, backend=FakeBackend(cpus=4))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Replica:
    def __init__(self, folder: Path, database: str, lease: float):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--_serve", str(self.port), str(folder), database]
        cmd.append(str(lease))
        with open(folder / "server.log", "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def ready(self) -> dict:
        import httpx

        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return {}


def _wait(what, timeout: float, step: float = 0.02):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout:.0f}s")


def _leader(replicas: list[Replica]) -> Replica | None:
    leading = [r for r in replicas if r.ready().get("role") == "leader"]
    return leading[0] if leading else None


def one_round(replicas: list[Replica], pause: bool, lease: float, folder: Path, db: str):
    """Signal the leader; (seconds until another leads, seconds until a job submitted to a
    follower after the signal is admitted)."""
    import httpx

    from tests.support.fakes import ADMIN

    leader = _wait(lambda: _leader(replicas), 60)
    others = [r for r in replicas if r is not leader]
    headers = {"Authorization": f"Bearer {ADMIN}"}
    t0 = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGSTOP if pause else signal.SIGKILL)
    job = httpx.post(f"{others[0].url}/v1/jobs", json=SPEC, headers=headers, timeout=30).json()
    _wait(lambda: _leader(others), 10 * lease)
    takeover = time.monotonic() - t0
    url = f"{others[0].url}/v1/jobs/{job['id']}"
    queued = lambda: httpx.get(url, headers=headers, timeout=5).json()["status"] != "QUEUED"  # noqa: E731
    _wait(queued, 10 * lease)
    admitted = time.monotonic() - t0
    if pause:
        os.kill(leader.proc.pid, signal.SIGCONT)
        _wait(lambda: leader.ready().get("role") == "follower", 10 * lease)
    else:
        leader.proc.wait()
        replicas.remove(leader)
        replicas.append(Replica(folder / f"r{len(os.listdir(folder))}", db, lease))
        _wait(lambda: replicas[-1].ready().get("status") == "ready", 60)
    return takeover, admitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease", type=float, default=10.0, help="ETRAIN_LEADER_LEASE_S")
    parser.add_argument("--database", default=os.environ.get("ETRAIN_TEST_POSTGRES_URL"))
    parser.add_argument("--_serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._serve:
        port, folder, database, lease = args._serve
        serve_fake(int(port), folder, database, float(lease))
        return
    from tests.support.postgres import fresh_schema, postgres_server

    with tempfile.TemporaryDirectory(prefix="etrain-failover-") as tmp:
        folder = Path(tmp)
        servers = postgres_server(folder / "pg") if not args.database else iter([args.database])
        for server in servers:
            for db in fresh_schema(server):
                run(args, folder / "replicas", db)


def run(args: argparse.Namespace, folder: Path, db: str) -> None:
    replicas = [Replica(folder / f"r{i}", db, args.lease) for i in range(args.replicas)]
    try:
        for r in replicas:
            _wait(lambda r=r: r.ready().get("status") == "ready", 120, step=0.2)
        rows = []
        for pause in (False, True):
            got = [one_round(replicas, pause, args.lease, folder, db) for _ in range(args.rounds)]
            rows.append(("paused (SIGSTOP)" if pause else "killed (SIGKILL)", got))
    finally:
        for r in replicas:
            if r.proc.poll() is None:
                os.kill(r.proc.pid, signal.SIGCONT)
                r.proc.terminate()
                r.proc.wait(30)
    print(f"\n{args.replicas} replicas, ETRAIN_LEADER_LEASE_S={args.lease:g}, {args.rounds} rounds")
    print("| leader | takeover s (median) | min | max | job admitted s (median) | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, got in rows:
        take, adm = [t for t, _ in got], [a for _, a in got]
        print(
            f"| {name} | {statistics.median(take):.2f} | {min(take):.2f} | {max(take):.2f} "
            f"| {statistics.median(adm):.2f} | {max(adm):.2f} |"
        )
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
