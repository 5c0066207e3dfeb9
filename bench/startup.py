"""Submit → first step through ``etrain serve``, in parts, against torchrun start → first step.

Per repeat, the script starts ``etrain serve`` with its embedded Ray head (the service's
default settings, a fresh data dir), waits for ``/readyz``, and submits ``--jobs`` jobs
over REST one after the other, each waited out before the next (``--gap`` seconds
later): the first runs on a fresh cluster, the others on a warm one (a cluster that has
run a job, and whose standby driver had the previous job's run and the gap to warm
up). Then it stops
the service and runs torchrun on the same loop (``bench/step_overhead.py``'s torchrun
path). The job: gpt-tiny, synthetic data, seq_len 128, global batch 16, micro batch 4,
DDP over 2 CPU workers, ``--steps`` steps.

Submit → first step is from the POST to the first ``GET /v1/jobs/{id}`` that shows
step >= 1 (polled every 0.1 s). Its parts come from stored timestamps: the service's
``admitted`` event, the ``startup`` data of rank 0's ``workers_started`` event
(``workers.warm.startup_times``: driver process start and Ray connected, or a
standby driver's hand-over, ``fit()`` called, controller start, worker group start,
actors alive, process group formed, train function entered, worker process start),
the event's own time (model built) and step 1's
metric time. Medians over repeats; the load average is printed beside the table.

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
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proctrace import ProcessSampler, print_trace  # noqa: E402
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


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def job_spec(steps: int) -> dict:
    """The job as the REST body: step_overhead's job, checkpoints off."""
    spec = build_spec_dict(steps=steps, seq_len=128, global_batch=16, micro=4)
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


def run_job(served, steps: int) -> dict:
    """Submit one job, wait for its first visible step, then for its end; its numbers."""
    with served.client() as c:
        t_post = time.time()
        r = c.post("/v1/jobs", json=job_spec(steps))
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
    return {"job_id": job_id, "total_s": t_visible - t_post, "marks": marks}


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


def serve_jobs(args: argparse.Namespace, work: Path, pythonpath: str | None) -> list[dict]:
    """One fresh ``etrain serve`` (code from ``pythonpath`` first, if given) and its jobs."""
    interval = Settings.model_fields["reconcile_interval_s"].default
    env = {"ETRAIN_RECONCILE_INTERVAL_S": str(interval)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath  # the head passes it on to drivers and workers
    here = os.getcwd()
    os.chdir(pythonpath or here)  # a driver's `python -m` looks in its cwd first
    try:
        data_dir = Path(tempfile.mkdtemp(dir=work, prefix="serve-"))
        served = start_serve(data_dir, ray_address=None, extra_env=env)
    finally:
        os.chdir(here)
    try:
        runs = []
        for i in range(args.jobs):
            if i:
                time.sleep(args.gap)
            if not args.trace:
                runs.append(run_job(served, args.steps))
                continue
            with ProcessSampler(served.proc.pid) as sampler:
                runs.append(run_job(served, args.steps))
            marks, kind = runs[-1]["marks"], "warm" if i else "fresh"
            print(f"\ntrace of job {i + 1} ({kind}), {runs[-1]['total_s']:.1f} s:")
            print_trace(sampler.seen, marks["post"], marks["visible"], os.cpu_count() or 1)
        return runs
    finally:
        served.stop()


def bench(args: argparse.Namespace, work: Path) -> dict:
    """Every repeat's fresh and warm jobs per variant, and torchrun runs."""
    variants = dict(v.split("=", 1) for v in args.variants.split(",")) if args.variants else {}
    variants = variants or {"etrain": ""}
    results: dict = {
        "variants": {},
        "torchrun": [],
        "load": [os.getloadavg()],
        "gap": args.gap,
    }
    for r in range(args.repeats):
        for name, pythonpath in variants.items():
            runs = serve_jobs(args, work, pythonpath or None)
            got = results["variants"].setdefault(name, {"fresh": [], "warm": []})
            got["fresh"].append(runs[0])
            got["warm"].extend(runs[1:])
            print(f"repeat {r + 1} {name}: " + ", ".join(f"{x['total_s']:.1f} s" for x in runs))
        results["torchrun"].append(torchrun_once(args.steps, work))
        print(f"repeat {r + 1} torchrun: {results['torchrun'][-1]:.1f} s", flush=True)
    results["load"].append(os.getloadavg())
    return results


def print_table(results: dict) -> None:
    """Medians: total, then each part, fresh and warm per variant; torchrun below."""
    columns = [
        (f"{name} {kind}", [parts_of(run["marks"]) for run in got[kind]], got[kind])
        for name, got in results["variants"].items()
        for kind in ("fresh", "warm")
    ]

    def med(rows, key):
        values = [row[key] for row in rows if key in row]
        return f"{statistics.median(values):>14.2f}" if values else f"{'-':>14}"

    print(
        "\nmedian of "
        + ", ".join(f"{len(runs)} {label}" for label, _, runs in columns)
        + f" jobs, {results.get('gap', 0):g} s between jobs; load average "
        + " -> ".join("/".join(f"{x:.2f}" for x in load) for load in results["load"])
    )
    print(f"\n{'seconds':<40}" + "".join(f"{label:>14}" for label, _, _ in columns))
    totals = "".join(
        f"{statistics.median(r['total_s'] for r in runs):>14.2f}" if runs else f"{'-':>14}"
        for _, _, runs in columns
    )
    print(f"{'submit -> first step (REST)':<40}{totals}")
    for label, _, _ in PARTS:
        print(f"  {label:<38}" + "".join(med(rows, label) for _, rows, _ in columns))
    tr = statistics.median(results["torchrun"])
    print(f"{'torchrun start -> end of step 1':<40}{tr:>14.2f}")


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
    work = Path(tempfile.mkdtemp(prefix="etrain-bench-startup-"))
    results = bench(args, work)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
