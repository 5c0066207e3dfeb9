"""Control-plane load: N concurrent clients submitting and listing jobs against a server
that already holds 1,000 jobs; prints p50/p99 per route and requests/s.

    .venv/bin/python bench/api_load.py                     # etrain serve, embedded Ray
    .venv/bin/python bench/api_load.py --server fake       # the app on a no-op backend
    .venv/bin/python bench/api_load.py --url http://127.0.0.1:8000 --token $ETRAIN_TOKEN

Without ``--url`` the bench starts the server itself, in its own process, on a free port
with a fresh data dir (SQLite): ``--server serve`` is ``etrain serve`` (an embedded Ray
head unless ``--ray-address``); ``--server fake`` is the same app (real store, scheduler
and reconciler) on ``tests/support/fakes.FakeBackend``, which starts no Ray job, to
isolate the control plane. Each client is its own tenant (the admin token makes one token
per client), so the per-tenant queued-jobs quota (default 100) holds ``--seed`` jobs
spread over the clients plus ``--requests`` more per client. The job asks for 1,024 CPUs
for its one worker: it can never fit, so it stays QUEUED and nothing trains.

Each client then runs ``--requests`` rounds of ``POST /v1/jobs`` and ``GET /v1/jobs``
(one page, ``limit=50``), one request at a time (asyncio, one connection per client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = {
    "name": "bench",
    "resources": {"workers": 1, "cpus_per_worker": 1024},
    "train": {"steps": 5, "global_batch_size": 4, "micro_batch_size": 4},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_fake(port: int, data_dir: str) -> None:
    """Run the app on FakeBackend (4 CPUs), as ``etrain serve`` runs it (uvicorn, 1 process)."""
    import uvicorn

    from service.api.app import create_app
    from tests.support.fakes import FakeBackend, dev_settings

    settings = dev_settings(Path(data_dir)).model_copy(update={"port": port})
    app = create_app(settings, backend=FakeBackend(cpus=4))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server(args: argparse.Namespace, data_dir: str) -> tuple[subprocess.Popen, str, str]:
    """Start the server under test; return it, its URL and its admin token."""
    port = _free_port()
    if args.server == "fake":
        from tests.support.fakes import ADMIN

        cmd = [sys.executable, __file__, "--_serve-fake", str(port), "--data-dir", data_dir]
        token, env = ADMIN, dict(os.environ)
    else:
        token = "et_bench-" + secrets.token_hex(16)
        env = {**os.environ, "ETRAIN_ADMIN_TOKEN": token, "ETRAIN_LOG_LEVEL": "WARNING"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [str(Path(sys.executable).parent / "etrain"), "serve", "--port", str(port)]
        cmd += ["--data-dir", data_dir]
        if args.ray_address:
            cmd += ["--ray-address", args.ray_address]
    log = open(Path(data_dir) / "server.log", "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", token


async def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as c:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}; see its server.log")
            try:
                if (await c.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{url}/readyz not ready after {timeout:.0f} s")


async def make_tenants(url: str, admin: str, n: int) -> list[dict]:
    """One token per client, each for its own tenant."""
    import httpx

    run = secrets.token_hex(3)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        headers = []
        for i in range(n):
            r = await c.post(
                "/v1/tokens",
                json={"tenant": f"bench-{run}-{i}", "name": "bench"},
                headers={"Authorization": f"Bearer {admin}"},
            )
            r.raise_for_status()
            headers.append({"Authorization": f"Bearer {r.json()['token']}"})
    return headers


async def seed(url: str, tenants: list[dict], jobs: int, parallel: int = 8) -> None:
    """Submit ``jobs`` jobs round-robin over ``tenants``, ``parallel`` at a time."""
    import httpx

    sem = asyncio.Semaphore(parallel)
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.post("/v1/jobs", json=SPEC, headers=tenants[i % len(tenants)])
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(jobs)))


async def seed_store(url: str, admin: str, clients: list[dict], jobs: int, rounds: int) -> None:
    """Store ``jobs`` QUEUED jobs: as many per client tenant as its queued quota (100 by
    default) leaves room for beside its ``rounds`` submits, the rest in tenants of their own."""
    per_client = max(0, min(jobs // len(clients), 100 - rounds))
    await seed(url, clients, per_client * len(clients))
    rest = jobs - per_client * len(clients)
    if rest > 0:
        extra = await make_tenants(url, admin, -(-rest // 100))
        await seed(url, extra, rest)


async def client_loop(url: str, headers: dict, rounds: int, out: dict[str, list]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
        for _ in range(rounds):
            calls = {
                "POST /v1/jobs": lambda: c.post("/v1/jobs", json=SPEC),
                "GET /v1/jobs": lambda: c.get("/v1/jobs", params={"limit": 50}),
            }
            for route, call in calls.items():
                if route not in out:
                    continue
                t0 = time.perf_counter()
                try:
                    r = await call()
                    ok = r.status_code < 400
                except httpx.HTTPError:
                    ok = False
                out[route].append((time.perf_counter() - t0, ok))


def _pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def _cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def measure(args: argparse.Namespace, url: str, admin: str, pid: int | None) -> dict:
    tenants = await make_tenants(url, admin, args.clients)
    t0 = time.perf_counter()
    await seed_store(url, admin, tenants, args.seed, args.requests)
    seeded_s = time.perf_counter() - t0
    out: dict[str, list] = {f"{m} /v1/jobs": [] for m in ("POST", "GET") if m in args.routes}
    load0, cpu0 = os.getloadavg(), _cpu_s(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(url, h, args.requests, out) for h in tenants))
    wall = time.perf_counter() - t0
    cpu1 = _cpu_s(pid)
    rows = []
    for route, samples in out.items():
        ms = [s * 1e3 for s, _ in samples]
        rows.append(
            {
                "route": route,
                "requests": len(samples),
                "errors": sum(not ok for _, ok in samples),
                "p50_ms": round(_pct(ms, 50), 1),
                "p99_ms": round(_pct(ms, 99), 1),
                "max_ms": round(max(ms), 1),
            }
        )
    total = sum(r["requests"] for r in rows)
    return {
        "clients": args.clients,
        "requests_per_client": args.requests,
        "routes_sent": " + ".join(r.split()[0] for r in out),
        "seeded_jobs": args.seed,
        "seed_s": round(seeded_s, 1),
        "wall_s": round(wall, 2),
        "requests_per_s": round(total / wall, 1),
        "server_cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 1),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "routes": rows,
    }


def print_table(res: dict) -> None:
    print(
        f"{res['clients']} clients x {res['requests_per_client']} rounds of {res['routes_sent']}, "
        f"{res['seeded_jobs']} jobs seeded first ({res['seed_s']} s)"
    )
    print(f"{'route':<16}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for r in res["routes"]:
        print(
            f"{r['route']:<16}{r['requests']:>9}{r['errors']:>8}"
            f"{r['p50_ms']:>9}{r['p99_ms']:>9}{r['max_ms']:>9}"
        )
    print(
        f"wall {res['wall_s']} s, {res['requests_per_s']} requests/s, server CPU "
        f"{res['server_cpu_s']} s; load average before {res['loadavg_before']}, after "
        f"{res['loadavg_after']} ({os.cpu_count()} cores)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="an etrain serve already running (needs --token)")
    p.add_argument("--token", help="its admin token (creates one tenant token per client)")
    p.add_argument("--server", choices=["serve", "fake"], default="serve")
    p.add_argument("--ray-address", help="with --server serve: an existing Ray cluster")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--requests", type=int, default=20, help="rounds of POST + GET per client")
    p.add_argument("--seed", type=int, default=1000, help="jobs stored before measuring")
    p.add_argument("--routes", default="POST,GET", help="which of the two each round sends")
    p.add_argument("--json", help="write the numbers here too")
    p.add_argument("--_serve-fake", dest="serve_fake", type=int, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake, args.data_dir)
        return
    proc = None
    with tempfile.TemporaryDirectory(prefix="etrain-api-load-") as data_dir:
        try:
            if args.url:
                if not args.token:
                    p.error("--url needs --token (an admin token)")
                url, admin = args.url.rstrip("/"), args.token
            else:
                proc, url, admin = start_server(args, data_dir)
            asyncio.run(wait_ready(url, proc))
            res = asyncio.run(measure(args, url, admin, proc.pid if proc else None))
        finally:
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print_table(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
