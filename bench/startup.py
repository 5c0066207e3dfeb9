"""Submit → first step through ``etrain serve``, in parts, against torchrun start → first step.

Per repeat, the script starts ``etrain serve`` with its embedded Ray head (the service's
default settings, a fresh data dir), waits for ``/readyz``, and submits ``--jobs`` jobs
over REST one after the other, each waited out before the next (``--gap`` seconds
later; 0: back to back, as a sweep, a CI pipeline or the test suite submits them): the
first runs on a fresh cluster, the others on a warm one. Then, after ``--pause`` seconds
of idle (a user's pause), it takes a census of the service's processes and submits one
more job, then ``--together`` jobs of one worker each submitted at once (a sweep: the
standby takes one, the next starts a driver of its own beside it, the rest queue).
``--busy N`` keeps N CPU-bound processes running beside it all (a busy machine); ``--env``
sets service settings (a pool of two standbys, say). Then it
stops the service, starts a fresh one, takes the same census
``--census-at`` seconds after its start without submitting anything (what an idle
service holds), and stops it. Then it runs torchrun on the same loop
(``bench/step_overhead.py``'s torchrun path). The job: gpt-tiny, synthetic data,
seq_len 128, global batch 16, micro batch 4, DDP over 2 CPU workers, ``--steps`` steps.

Submit → first step is from the POST to the first ``GET /v1/jobs/{id}`` that shows
step >= 1 (polled every 0.1 s). Its parts come from stored timestamps: the service's
``admitted`` event, the ``startup`` data of rank 0's ``workers_started`` event
(``workers.warm.startup_times``: driver process start and Ray connected, or a
standby driver's hand-over, ``fit()`` called, controller start, worker group start,
actors alive, process group formed, train function entered, worker process start),
the event's own time (model built) and step 1's
metric time. Medians over repeats; the load average is printed beside the table. Each
job's log is searched for Ray's warning that a node started more worker processes than
its startup concurrency (``RAY_WARNING``); the count is printed per column.

``--variants before=/other/checkout,after=`` compares checkouts: each repeat starts
one service per variant with that path first on ``PYTHONPATH`` (the embedded head
passes it to drivers and workers); marks a checkout lacks merge into the next part.

``--trace`` also prints, after each job, how many CPU seconds the service's processes
used from its POST to its first step against what the cores could give (per 2 s
window, and the least time that CPU takes with every core busy), and each process that ran
meanwhile with its titles in turn (``proctrace.py``).

    .venv/bin/python bench/startup.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proctrace import Census, ProcessSampler, census, print_trace  # noqa: E402
from step_overhead import build_spec_dict, launch_torchrun  # noqa: E402

from service.settings import Settings  # noqa: E402
from tests.e2e.conftest import start_serve  # noqa: E402
from tests.support.polling import wait_for  # noqa: E402

# (label, start mark, end mark): consecutive marks; a missing mark merges its part
# into the next one.
PARTS = (
    ("API + scheduler (POST -> admitted)", "post", "admitted"),
    ("standby driver takes the job", "admitted", "assigned"),
    ("Ray job start (-> driver process)", "admitted", "driver_process"),
    ("driver: imports + ray.init", "driver_process", "ray_connected"),
    ("driver: trainer built, fit()", "ray_connected", "driver_ready"),
    ("controller actor start", "driver_ready", "controller_start"),
    ("controller run -> group start", "controller_start", "group_start"),
    ("worker group: placement + actors", "group_start", "actors_ready"),
    ("train context + process group", "actors_ready", "backend_ready"),
    ("train fn launched", "backend_ready", "train_fn"),
    ("model built (in train fn)", "train_fn", "workers_started"),
    ("first step", "workers_started", "step1"),
    ("telemetry -> visible in GET", "step1", "visible"),
)


# Ray's raylet, to every driver, when a node runs several times more worker processes than
# it starts at once ("N PYTHON worker processes have been started on node ... which is Kx
# the maximum expected startup concurrency").
RAY_WARNING = "maximum expected startup concurrency"
KINDS = ("fresh", "warm", "after pause", "together")


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def job_spec(steps: int, workers: int = 2) -> dict:
    """The job as the REST body: step_overhead's job on ``workers``, checkpoints off."""
    spec = build_spec_dict(steps=steps, seq_len=128, global_batch=16, micro=4)
    spec["resources"]["workers"] = workers
    return {**spec, "name": "bench-startup"}


def marks_of(client, job_id: str, t_post: float, t_visible: float) -> dict[str, float]:
    """Every timestamp of the job's start, by name (Unix seconds)."""
    events = client.get(f"/v1/jobs/{job_id}/events").json()["items"]
    metrics = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    marks = {"post": t_post, "visible": t_visible}
    for e in events:
        if e["kind"] == "admitted" and "admitted" not in marks:
            marks["admitted"] = _ts(e["ts"])
        if e["kind"] == "workers_started" and "workers_started" not in marks:
            marks["workers_started"] = _ts(e["ts"])
            marks.update((e.get("data") or {}).get("startup") or {})
    step1 = [m for m in metrics if m["step"] == 1]
    if step1:
        marks["step1"] = _ts(step1[0]["ts"])
    return marks


def run_job(served, steps: int, workers: int = 2) -> dict:
    """Submit one job, wait for its first visible step, then for its end; its numbers."""
    with served.client() as c:
        t_post = time.time()
        r = c.post("/v1/jobs", json=job_spec(steps, workers))
        r.raise_for_status()
        job_id = r.json()["id"]

        def first_step():
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"job {job_id} {job['status']}: {job.get('error')}")
            return job["step"] >= 1 and time.time()

        t_visible = wait_for(first_step, timeout=300, every=0.1, what="the first step")
        wait_for(
            lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "SUCCEEDED",
            timeout=300,
            every=0.2,
            what=f"job {job_id} to succeed",
        )
        marks = marks_of(c, job_id, t_post, t_visible)
        warnings = [
            x for x in c.get(f"/v1/jobs/{job_id}/logs").text.splitlines() if RAY_WARNING in x
        ]
    return {
        "job_id": job_id,
        "total_s": t_visible - t_post,
        "marks": marks,
        "ray_warnings": len(warnings),
        "ray_warning_lines": warnings,  # in --json
    }


def parts_of(marks: dict[str, float]) -> dict[str, float]:
    """Seconds per part; a part whose start mark is missing starts at the last mark seen."""
    out, last = {}, marks["post"]
    for label, _, end in PARTS:
        if end in marks:
            out[label] = marks[end] - last
            last = marks[end]
    return out


def torchrun_once(steps: int, work: Path) -> float:
    """torchrun start -> end of step 1 on the slower rank."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="torchrun-"))
    spec = build_spec_dict(steps=steps, seq_len=128, global_batch=16, micro=4)
    t0, ranks = launch_torchrun(spec, out)
    return max(r["first_step_end"] for r in ranks) - t0


def _serve(work: Path, pythonpath: str | None):
    """A fresh ``etrain serve`` (code from ``pythonpath`` first, if given), ready."""
    interval = Settings.model_fields["reconcile_interval_s"].default
    env = {"ETRAIN_RECONCILE_INTERVAL_S": str(interval), **SERVICE_ENV}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath  # the head passes it on to drivers and workers
    here = os.getcwd()
    os.chdir(pythonpath or here)  # a driver's `python -m` looks in its cwd first
    try:
        data_dir = Path(tempfile.mkdtemp(dir=work, prefix="serve-"))
        return start_serve(data_dir, ray_address=None, extra_env=env)
    finally:
        os.chdir(here)


SERVICE_ENV: dict[str, str] = {}  # --env: the service's settings beyond its defaults


def serve_jobs(args: argparse.Namespace, work: Path, pythonpath: str | None) -> dict:
    """One fresh ``etrain serve`` and its jobs: ``--jobs`` with ``--gap`` between them,
    then one after ``--pause`` (with a census of the idle service just before it)."""
    served = _serve(work, pythonpath)
    try:
        runs: dict = {kind: [] for kind in KINDS}

        def one(kind: str) -> None:
            if not args.trace:
                runs[kind].append(run_job(served, args.steps))
                return
            with ProcessSampler(served.proc.pid) as sampler:
                runs[kind].append(run_job(served, args.steps))
            marks = runs[kind][-1]["marks"]
            print(f"\ntrace of a job ({kind}), {runs[kind][-1]['total_s']:.1f} s:")
            print_trace(sampler.seen, marks["post"], marks["visible"], os.cpu_count() or 1)

        for i in range(args.jobs):
            if i:
                time.sleep(args.gap)
            one("warm" if i else "fresh")
        if args.pause:
            time.sleep(args.pause)
            runs["census_pause"] = vars(census(served.proc.pid))
            one("after pause")
        if args.together:  # a sweep, 1 worker each: two fit 2 CPUs at once
            with ThreadPoolExecutor(args.together) as pool:
                jobs = [pool.submit(run_job, served, args.steps, 1) for _ in range(args.together)]
                runs["together"] = [job.result() for job in jobs]
        return runs
    finally:
        served.stop()


def idle_census(args: argparse.Namespace, work: Path, pythonpath: str | None) -> dict:
    """A fresh ``etrain serve`` left idle: its census ``--census-at`` s after its start."""
    served = _serve(work, pythonpath)
    try:
        import psutil

        started = psutil.Process(served.proc.pid).create_time()
        time.sleep(max(0.0, started + args.census_at - time.time()))
        return vars(census(served.proc.pid))
    finally:
        served.stop()


def bench(args: argparse.Namespace, work: Path) -> dict:
    """Every repeat's jobs and idle census per variant, and torchrun runs."""
    variants = dict(v.split("=", 1) for v in args.variants.split(",")) if args.variants else {}
    variants = variants or {"etrain": ""}
    results: dict = {
        "variants": {},
        "torchrun": [],
        "load": [os.getloadavg()],
        "gap": args.gap,
        "pause": args.pause,
        "census_at": args.census_at,
        "busy": args.busy,
    }
    burners = [  # a busy machine: other work on the cores, at the same priority
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    try:
        _repeats(args, work, variants, results)
    finally:
        for burner in burners:
            burner.kill()
    results["load"].append(os.getloadavg())
    return results


def _repeats(args: argparse.Namespace, work: Path, variants: dict, results: dict) -> None:
    for r in range(args.repeats):
        for name, pythonpath in variants.items():
            runs = serve_jobs(args, work, pythonpath or None)
            got = results["variants"].setdefault(
                name, {**{kind: [] for kind in KINDS}, "census_idle": [], "census_pause": []}
            )
            for kind in KINDS:
                got[kind].extend(runs[kind])
            if "census_pause" in runs:
                got["census_pause"].append(runs["census_pause"])
            if args.census_at:
                got["census_idle"].append(idle_census(args, work, pythonpath or None))
            times = [f"{x['total_s']:.1f} s" for kind in KINDS for x in runs[kind]]
            print(f"repeat {r + 1} {name}: " + ", ".join(times), flush=True)
        results["torchrun"].append(torchrun_once(args.steps, work))
        print(f"repeat {r + 1} torchrun: {results['torchrun'][-1]:.1f} s", flush=True)


def print_table(results: dict) -> None:
    """Medians: total, then each part, per kind of job and variant; torchrun below; then
    Ray's warnings and the censuses."""
    columns = [
        (f"{name} {kind}", [parts_of(run["marks"]) for run in got[kind]], got[kind])
        for name, got in results["variants"].items()
        for kind in KINDS
        if got[kind]
    ]

    def med(rows, key):
        values = [row[key] for row in rows if key in row]
        return f"{statistics.median(values):>14.2f}" if values else f"{'-':>14}"

    print(
        "\nmedian of "
        + ", ".join(f"{len(runs)} {label}" for label, _, runs in columns)
        + f" jobs; warm: {results.get('gap', 0):g} s after the previous job's end; after "
        + f"pause: {results.get('pause', 0):g} s after it; together: submitted at once; "
        + f"{results.get('busy', 0)} CPU-bound processes beside; load average "
        + " -> ".join("/".join(f"{x:.2f}" for x in load) for load in results["load"])
    )
    print(f"\n{'seconds':<40}" + "".join(f"{label[-14:]:>14}" for label, _, _ in columns))
    totals = "".join(
        f"{statistics.median(r['total_s'] for r in runs):>14.2f}" for _, _, runs in columns
    )
    print(f"{'submit -> first step (REST)':<40}{totals}")
    for label, _, _ in PARTS:
        print(f"  {label:<38}" + "".join(med(rows, label) for _, rows, _ in columns))
    tr = statistics.median(results["torchrun"])
    print(f"{'torchrun start -> end of step 1':<40}{tr:>14.2f}")
    warned = "".join(f"{sum(r.get('ray_warnings', 0) for r in runs):>14}" for _, _, runs in columns)
    print(f"{'Ray worker-count warnings (all jobs)':<40}{warned}")
    print_censuses(results)


def print_censuses(results: dict) -> None:
    """The idle service's processes and memory, per variant (medians)."""
    at, pause = results.get("census_at", 0), results.get("pause", 0)
    print(f"\n{'idle service (median)':<46}{'processes':>10}{'PSS GB':>9}{'RSS GB':>9}")
    for name, got in results["variants"].items():
        for key, label in (
            ("census_idle", f"{at:g} s after start"),
            ("census_pause", f"{pause:g} s after a job"),
        ):
            rows = [Census(**c) for c in got.get(key, [])]
            if not rows:
                continue
            procs = statistics.median(c.processes for c in rows)
            pss = statistics.median(c.pss_bytes for c in rows) / 1e9
            rss = statistics.median(c.rss_bytes for c in rows) / 1e9
            print(f"  {name + ', ' + label:<44}{procs:>10g}{pss:>9.2f}{rss:>9.2f}")
            top = sorted(rows[-1].titles.items(), key=lambda kv: -kv[1])
            print("    " + ", ".join(f"{t} x{n}" for t, n in top))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="fresh services (one fresh job each)")
    p.add_argument("--jobs", type=int, default=3, help="jobs per service (1 fresh, rest warm)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds between one job's end and the next job's submission (a user's pause)",
    )
    p.add_argument(
        "--variants",
        help="name=PYTHONPATH,...: compare checkouts of etrain, interleaved per repeat "
        "(an empty path is this one)",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=50.0,
        help="seconds of idle before one more job after the others (0: none)",
    )
    p.add_argument(
        "--census-at",
        type=float,
        default=60.0,
        help="census of a fresh idle service this many seconds after its start (0: none)",
    )
    p.add_argument(
        "--together",
        type=int,
        default=0,
        help="then this many 1-worker jobs submitted at once (a sweep), after the last job",
    )
    p.add_argument(
        "--busy",
        type=int,
        default=0,
        help="CPU-bound processes kept running beside the service (a busy machine)",
    )
    p.add_argument(
        "--env",
        default="",
        help="NAME=VALUE,...: service settings for every service started (e.g. "
        "ETRAIN_STANDBY_DRIVERS=2,ETRAIN_WARM_POOL_PROCESSES=12)",
    )
    p.add_argument("--json", type=Path, help="also write every run here")
    p.add_argument(
        "--trace",
        action="store_true",
        help="after each job, the CPU its start kept busy and its processes (proctrace.py)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    args = parse_args(argv)
    SERVICE_ENV.update(kv.split("=", 1) for kv in args.env.split(",") if kv)
    work = Path(tempfile.mkdtemp(prefix="etrain-bench-startup-"))
    results = bench(args, work)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
