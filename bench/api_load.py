"""Control-plane load: N concurrent clients submitting and listing jobs against a server
that already holds 1,000 jobs; prints p50/p99, requests/s and the server's CPU per request
for each route.

    .venv/bin/python bench/api_load.py                     # etrain serve, embedded Ray
    .venv/bin/python bench/api_load.py --server fake       # the app on a no-op backend
    .venv/bin/python bench/api_load.py --server fake --replicas 1,2 \
        --database-url postgresql+psycopg://etrain:etrain@127.0.0.1:5432/etrain_test
    .venv/bin/python bench/api_load.py --url http://127.0.0.1:8000 --token $ETRAIN_TOKEN

Without ``--url`` the bench starts the servers itself, each in its own process, on a free
port with a fresh data dir: ``--server serve`` is ``etrain serve`` (an embedded Ray head
unless ``--ray-address``; replicas need one); ``--server fake`` is the same app (real store,
scheduler and reconciler) on ``tests/support/fakes.FakeBackend``, which starts no Ray job, to
isolate the control plane. The store is SQLite unless ``--database-url`` names PostgreSQL,
which ``--replicas`` above 1 needs: the clients then spread over the replicas, one each in
turn, and each count in ``--replicas`` (e.g. ``1,2``) is measured on an emptied database
in the same run, to compare. Each client is its own tenant (the admin token makes one
token per client), so the per-tenant queued-jobs quota (default 100) holds ``--seed`` jobs
spread over the clients plus ``--requests`` more per client. The job asks for 1,024 CPUs
for its one worker: it can never fit, so it stays QUEUED and nothing trains.

Each route is measured on its own: every client sends ``--requests`` ``POST /v1/jobs``,
one at a time (asyncio, one connection per client), then as many ``GET /v1/jobs`` (one
page, ``limit=50``). The servers' CPU (user + system, from /proc) over each phase divided by
its requests is the route's CPU per request.
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


ROUTES = {"POST": "POST /v1/jobs", "GET": "GET /v1/jobs", "HEALTH": "GET /healthz"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_fake(port: int, data_dir: str, database_url: str | None) -> None:
    """Run the app on FakeBackend (4 CPUs), as ``etrain serve`` runs it (uvicorn, 1 process)."""
    import uvicorn

    from service.api.app import create_app
    from tests.support.fakes import FakeBackend, dev_settings

    store = {"database_url": database_url} if database_url else {}
    settings = dev_settings(Path(data_dir), port=port, **store)
    app = create_app(settings, backend=FakeBackend(cpus=4))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server(
    args: argparse.Namespace, data_dir: Path, database_url: str | None
) -> tuple[subprocess.Popen, str, str]:
    """Start one server under test; return it, its URL and its admin token."""
    port = _free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.server == "fake":
        from tests.support.fakes import ADMIN

        cmd = [sys.executable, __file__, "--_serve-fake", str(port), "--data-dir", str(data_dir)]
        cmd += ["--_database-url", database_url] if database_url else []
        token, env = ADMIN, dict(os.environ)
    else:
        token = args.admin_token
        env = {**os.environ, "ETRAIN_ADMIN_TOKEN": token, "ETRAIN_LOG_LEVEL": "WARNING"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if database_url:
            env["ETRAIN_DATABASE_URL"] = database_url
        cmd = [str(Path(sys.executable).parent / "etrain"), "serve", "--port", str(port)]
        cmd += ["--data-dir", str(data_dir)]
        if args.ray_address:
            cmd += ["--ray-address", args.ray_address]
    log = open(data_dir / "server.log", "w")  # noqa: SIM115 - lives as long as the server
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


async def client_loop(url: str, headers: dict, rounds: int, route: str, out: list) -> None:
    """Send ``rounds`` requests of ``route`` one at a time; append (seconds, ok) to ``out``.

    aiohttp, not httpx: on 2 cores the clients share the machine with the servers, and
    httpx spent about 2 ms of CPU a request, more than a server spends on a list page."""
    import aiohttp

    body = json.dumps(SPEC).encode()
    post_headers = {**headers, "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as c:
        for _ in range(rounds):
            t0 = time.perf_counter()
            try:
                if route == "POST":
                    r = c.post("/v1/jobs", data=body, headers=post_headers)
                elif route == "GET":
                    r = c.get("/v1/jobs", params={"limit": 50}, headers=headers)
                else:  # the floor: a route that reads nothing
                    r = c.get("/healthz")
                async with r as response:
                    await response.read()
                    ok = response.status < 400
            except aiohttp.ClientError:
                ok = False
            out.append((time.perf_counter() - t0, ok))


def _pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy so far (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float | None:
    """User + system CPU seconds of the processes ``pids`` together (Linux), or None."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None
    return total


def _switches(pids: list[int]) -> int | None:
    """Context switches (voluntary + involuntary) of every live thread of ``pids`` so far
    (Linux), or None. A thread that ended during a phase takes its count with it."""
    total = 0
    for pid in pids:
        try:
            for status in Path(f"/proc/{pid}/task").glob("*/status"):
                for line in status.read_text().splitlines():
                    if "ctxt_switches:" in line:
                        total += int(line.split()[-1])
        except (OSError, ValueError):
            return None
    return total


LOOP_CPU = "etrain_reconciler_tick_cpu_seconds_total"


async def _loop_cpu_s(urls: list[str], admin: str) -> float | None:
    """CPU seconds the control loop's ticks took so far, summed over the replicas (their
    /metrics), or None where a server does not say."""
    import httpx

    total = 0.0
    async with httpx.AsyncClient(timeout=30) as c:
        for url in urls:
            r = await c.get(f"{url}/metrics", headers={"Authorization": f"Bearer {admin}"})
            line = next((ln for ln in r.text.splitlines() if ln.startswith(LOOP_CPU)), None)
            if r.status_code != 200 or line is None:
                return None
            total += float(line.split()[-1])
    return total


async def _phase(
    urls: list[str],
    admin: str,
    pids: list[int],
    clients: list[dict],
    method: str,
    rounds: int,
    label: str,
) -> dict:
    """``rounds`` requests of ``method`` from each of ``clients`` at once: one table row."""
    samples: list = []
    print(f"{len(urls)} replica(s): measuring {label}", file=sys.stderr, flush=True)
    loop0 = await _loop_cpu_s(urls, admin)
    cpu0, switches0, t0, own0, busy0 = (
        _cpu_s(pids),
        _switches(pids),
        time.perf_counter(),
        time.process_time(),
        _machine_busy_s(),
    )
    await asyncio.gather(
        *(
            client_loop(urls[i % len(urls)], h, rounds, method, samples)
            for i, h in enumerate(clients)
        )
    )
    wall, cpu1, switches1 = time.perf_counter() - t0, _cpu_s(pids), _switches(pids)
    client_cores, busy_cores = (
        (time.process_time() - own0) / wall,
        (_machine_busy_s() - busy0) / wall,
    )
    loop1 = await _loop_cpu_s(urls, admin)
    ms = [s * 1e3 for s, _ in samples]
    cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) * 1e3 / len(samples)
    loop = None if loop0 is None or loop1 is None else (loop1 - loop0) * 1e3 / len(samples)
    switches = None if None in (switches0, switches1) else (switches1 - switches0) / len(samples)
    return {
        "route": label,
        "requests": len(samples),
        "errors": sum(not ok for _, ok in samples),
        # With one client (after the pause): its first request.
        "first_ms": round(ms[0], 1) if len(clients) == 1 else None,
        "p50_ms": round(_pct(ms, 50), 1),
        "p99_ms": round(_pct(ms, 99), 1),
        "max_ms": round(max(ms), 1),
        "requests_per_s": round(len(samples) / wall, 1),
        "server_cpu_ms_per_request": None if cpu is None else round(cpu, 2),
        # of which the control loop's ticks (the reconciler's thread, /metrics)
        "loop_cpu_ms_per_request": None if loop is None else round(loop, 2),
        # the servers' threads' context switches (/proc/PID/task/*/status) per request
        "switches_per_request": None if switches is None else round(switches),
        "client_cores": round(client_cores, 2),  # the clients' own CPU / wall
        "busy_cores": round(busy_cores, 2),  # every process of the machine
    }


async def measure(args: argparse.Namespace, urls: list[str], admin: str, pids: list[int]) -> dict:
    """Each route under load (every client at once), then, after ``--pause`` seconds of
    nothing, each route from one client on the quiet server (its first request included)."""
    tenants = await make_tenants(urls[0], admin, args.clients)
    t0 = time.perf_counter()
    await seed_store(urls[0], admin, tenants, args.seed, args.requests)
    seeded_s = time.perf_counter() - t0
    load0 = os.getloadavg()
    methods = [m for m in ("POST", "GET", "HEALTH") if m in args.routes.split(",")]
    rows = [await _phase(urls, admin, pids, tenants, m, args.requests, ROUTES[m]) for m in methods]
    if args.pause:
        for m in methods:
            await asyncio.sleep(args.pause)
            label = f"{ROUTES[m]} quiet"
            rows.append(await _phase(urls, admin, pids, tenants[:1], m, args.quiet_requests, label))
    return {
        "replicas": len(urls),
        "clients": args.clients,
        "requests_per_client": args.requests,
        "seeded_jobs": args.seed,
        "seed_s": round(seeded_s, 1),
        "pause_s": args.pause,
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "routes": rows,
    }


def print_table(results: list[dict]) -> None:
    first = results[0]
    print(
        f"{first['clients']} clients x {first['requests_per_client']} requests of each route, "
        f"{first['seeded_jobs']} jobs seeded first; server CPU from /proc over each route's "
        f"phase, of which loop = the control loop's ticks (its /metrics); switches = the "
        f"servers' threads' context switches per request; clients = cores the "
        f"clients' process used, busy = cores the machine used ({os.cpu_count()} cores); "
        f"quiet: one client after {first.get('pause_s', 0)} s of nothing, first = its first request"
    )
    head = f"{'replicas':>8} {'route':<20}{'requests':>9}{'errors':>7}{'first':>7}{'p50 ms':>8}"
    head += f"{'p99 ms':>8}"
    head += f"{'req/s':>8}{'vs 1st':>7}{'CPU ms/req':>11}{'loop':>6}{'switches':>9}"
    print(head + f"{'clients':>8}{'busy':>6}")
    base = {r["route"]: r["requests_per_s"] for r in first["routes"]}
    for res in results:
        for r in res["routes"]:
            ratio = r["requests_per_s"] / base[r["route"]]
            cpu, loop = r["server_cpu_ms_per_request"], r.get("loop_cpu_ms_per_request")
            switches = r.get("switches_per_request")
            print(
                f"{res['replicas']:>8} {r['route']:<20}{r['requests']:>9}{r['errors']:>7}"
                f"{r.get('first_ms') or '-':>7}{r['p50_ms']:>8}{r['p99_ms']:>8}"
                f"{r['requests_per_s']:>8}{ratio:>6.2f}x"
                f"{_or_dash(cpu):>11}{_or_dash(loop):>6}{_or_dash(switches):>9}"
                f"{r['client_cores']:>8}{r['busy_cores']:>6}"
            )


def _or_dash(value: object) -> object:
    return "-" if value is None else value


def run_one(args: argparse.Namespace, replicas: int, database_url: str | None) -> dict:
    """Start ``replicas`` servers on one store, measure them, stop them."""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="etrain-api-load-") as data_dir:
        try:
            urls = []
            for i in range(replicas):
                proc, url, admin = start_server(args, Path(data_dir) / f"r{i}", database_url)
                procs.append(proc)
                urls.append(url)
                # One at a time: the first migrates the schema, the next find it current.
                asyncio.run(wait_ready(url, proc))
            return asyncio.run(measure(args, urls, admin, [p.pid for p in procs]))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="an etrain serve already running (needs --token)")
    p.add_argument("--token", help="its admin token (creates one tenant token per client)")
    p.add_argument("--server", choices=["serve", "fake"], default="serve")
    p.add_argument("--ray-address", help="with --server serve: an existing Ray cluster")
    p.add_argument("--database-url", help="PostgreSQL for the servers (default: SQLite)")
    p.add_argument("--replicas", default="1", help="servers on one store, e.g. 1,2 to compare")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--requests", type=int, default=20, help="requests of each route per client")
    p.add_argument("--seed", type=int, default=1000, help="jobs stored before measuring")
    p.add_argument(
        "--routes", default="POST,GET,HEALTH", help="which to measure (HEALTH: the floor)"
    )
    p.add_argument("--pause", type=float, default=0, help="then, after S s idle, one client")
    p.add_argument("--quiet-requests", type=int, default=50, help="its requests of each route")
    p.add_argument("--json", help="write the numbers here too")
    p.add_argument("--_serve-fake", dest="serve_fake", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_database-url", dest="fake_database_url", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake, args.data_dir, args.fake_database_url)
        return
    counts = [int(n) for n in args.replicas.split(",")]
    if max(counts) > 1 and not (args.database_url or "").startswith("postgresql"):
        p.error("--replicas above 1 needs --database-url postgresql+psycopg://...")
    if max(counts) > 1 and args.server == "serve" and not args.ray_address:
        p.error("--replicas above 1 with --server serve needs --ray-address (one Ray cluster)")
    args.admin_token = "et_bench-" + secrets.token_hex(16)
    if args.url:
        if not args.token:
            p.error("--url needs --token (an admin token)")
        url = args.url.rstrip("/")
        asyncio.run(wait_ready(url, None))
        results = [asyncio.run(measure(args, [url], args.token, []))]
    else:
        results = [run_one_store(args, n) for n in counts]
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def run_one_store(args: argparse.Namespace, replicas: int) -> dict:
    """``run_one`` on an empty store: a fresh schema of ``--database-url``, or new SQLite."""
    if not args.database_url:
        return run_one(args, replicas, None)
    from tests.support.postgres import fresh_schema

    schema = fresh_schema(args.database_url)
    try:
        return run_one(args, replicas, next(schema))
    finally:
        next(schema, None)


if __name__ == "__main__":
    main()
