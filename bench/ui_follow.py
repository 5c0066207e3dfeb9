"""Ten browser tabs following one job: what they cost the control plane's CPU.

    .venv/bin/python bench/ui_follow.py                  # 0 vs 10 tabs, 20 s windows
    .venv/bin/python bench/ui_follow.py --tabs 5 --window 30

Starts ``etrain serve`` (an embedded Ray head, fresh data dir, free port) as a user runs
it, submits one small job that trains for longer than the bench lasts, and once it
reports steps measures the control plane over equal windows: with no tab open, with
``--tabs`` headless chromium tabs (each its own browser context, signed in through
``/ui/signin``) on the job's page ``/ui/jobs/{id}``, and with none again after they close.

CPU is ``psutil`` ``cpu_times`` (user + system) of the ``etrain serve`` process and its
children outside the embedded Ray head's process tree (none today), as a delta over the
window's wall time: 100 % = one core. Requests are uvicorn's access-log lines in
``serve.log`` written during the window (the control plane's ``/metrics`` counts
submissions and telemetry points, not HTTP requests). The job's own telemetry posts and
the reconciler run in every window, so the difference between windows is the tabs'.
Chromium's own CPU is not counted (it is the browser's), but on a small machine it
competes for the same cores.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = {
    "name": "ui-follow",
    "model": {"preset": "gpt-tiny"},
    "data": {"seq_len": 16, "num_samples": 512},
    "resources": {"workers": 1},
    "train": {"steps": 100000, "global_batch_size": 4, "micro_batch_size": 2},
    "checkpoint": {"every_steps": 50},
}
REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')


def control_plane(serve: psutil.Process) -> list[psutil.Process]:
    """``etrain serve`` and its children, less the embedded Ray head and what it started."""
    out = [serve]
    for child in serve.children():
        try:
            ray = "ray" in Path(child.cmdline()[1] if len(child.cmdline()) > 1 else "").name
        except psutil.Error:
            continue
        if not ray:
            out += [child, *child.children(recursive=True)]
    return out


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def measure(serve: psutil.Process, log: Path, seconds: float, *, page=None) -> dict:
    """CPU % of one core and requests/s (by kind) of the control plane over ``seconds``.

    With tabs open, the wait is ``page.wait_for_timeout``: the tabs' requests pass through
    the Tab's loopback filter, a playwright route handler that only runs while playwright's
    sync API has control; under ``time.sleep`` every request of every tab would stall.
    """
    procs = control_plane(serve)
    offset = log.stat().st_size
    cpu0, t0 = cpu_seconds(procs), time.monotonic()
    if page is None:
        time.sleep(seconds)
    else:
        page.wait_for_timeout(seconds * 1000)
    cpu1, wall = cpu_seconds(procs), time.monotonic() - t0
    with open(log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace")
    kinds: dict[str, int] = {}
    for _method, path, _status in REQUEST.findall(lines):
        kind = "telemetry" if path.endswith("/telemetry") else ("ui" if "/ui/" in path else "api")
        if path.startswith("/readyz") or path.startswith("/healthz"):
            kind = "probe"
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
        "req_s": sum(kinds.values()) / wall,
        "kinds": {k: v / wall for k, v in sorted(kinds.items())},
        "wall": wall,
    }


def open_tabs(browser, n: int, url: str, token: str, job_id: str) -> list:
    """``n`` tabs, each signed in through the form, on the job's page."""
    from tests.support.browser import Tab

    tabs = []
    for _ in range(n):
        tab = Tab(browser, Path(tempfile.mkdtemp(prefix="ui-follow-shots-")))
        tab.sent = []  # the API requests this tab made, as the browser saw them
        tab.page.on("request", lambda r, t=tab: "/v1/" in r.url and t.sent.append(time.monotonic()))
        tab.page.goto(f"{url}/ui/signin")
        tab.page.fill("#token", token)
        tab.page.click("#signin-button")
        tab.page.wait_for_selector("#jobs-table", timeout=60_000)
        tab.page.goto(f"{url}/ui/jobs/{job_id}")
        tab.page.wait_for_selector("#chart-loss polyline.series", timeout=60_000)
        tabs.append(tab)
    return tabs


def row(label: str, m: dict) -> str:
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in m["kinds"].items())
    return f"| {label} | {m['cpu_pct']:.1f} | {m['req_s']:.1f} | {kinds} |"


def run(tabs: int, window: float) -> None:
    from tests.e2e.conftest import start_serve
    from tests.support.browser import chromium
    from tests.support.polling import wait_for

    served = start_serve(Path(tempfile.mkdtemp(prefix="ui-follow-")), ray_address=None)
    try:
        with served.client() as c:
            job_id = c.post("/v1/jobs", json=SPEC).json()["id"]
            wait_for(
                lambda: (c.get(f"/v1/jobs/{job_id}").json().get("step") or 0) > 0,
                timeout=300,
                what="the job's first step",
            )
            serve = psutil.Process(served.proc.pid)
            before = measure(serve, served.log, window)
            with chromium() as browser:
                opened = open_tabs(browser, tabs, served.url, served.token, job_id)
                opened[0].page.wait_for_timeout(3000)  # every page past its first loads
                t0 = time.monotonic()
                during = measure(serve, served.log, window, page=opened[0].page)
                sent = sum(1 for t in opened for at in t.sent if at >= t0)
                during["browser_req_s"] = sent / during["wall"]
                errors = [e for t in opened for e in t.errors]
                for tab in opened:
                    tab.close()
            after = measure(serve, served.log, window)
            job = c.get(f"/v1/jobs/{job_id}").json()
            c.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        served.stop()
    assert job["status"] == "RUNNING", f"the job stopped during the bench: {job['status']}"
    print(f"\nwindows of {window:g} s; the job trained throughout (step {job['step']})\n")
    print("| tabs | control-plane CPU, % of one core | requests/s | requests/s by kind |")
    print("|---|---|---|---|")
    print(row("0 (before)", before))
    print(row(str(tabs), during))
    print(row("0 (after)", after))
    print(f"\nAPI requests the tabs sent (browser side): {during['browser_req_s']:.1f}/s")
    if errors:
        print(f"tab errors: {errors[:5]}")
    idle = (before["cpu_pct"] + after["cpu_pct"]) / 2
    print(
        f"\n{tabs} tabs / 0 tabs CPU: {during['cpu_pct'] / max(idle, 1e-9):.2f}x "
        f"(+{during['cpu_pct'] - idle:.1f} points of one core, "
        f"{(during['cpu_pct'] - idle) / tabs:.2f} per tab)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tabs", type=int, default=10)
    ap.add_argument("--window", type=float, default=20.0, help="seconds per measurement")
    args = ap.parse_args()
    run(args.tabs, args.window)


if __name__ == "__main__":
    main()
