"""The web pages in a real browser (Debian chromium) against a real `etrain serve` on the
session's Ray cluster: sign-in, the jobs table, a job's live charts with a restart marker
after a worker is killed, Cancel, the plan page, tenants kept apart, and an 800px window."""

from __future__ import annotations

import json
import os
import re
import signal

import psutil
import pytest
import yaml

from service.api.cluster_schemas import NodePublic
from service.planner.hardware import GPU_MEMORY_LABEL, cluster_from_nodes
from tests.support.processes import job_processes
from tests.support.specs import MIXED_GPU_CLUSTER, MIXED_GPU_JOB

pytestmark = pytest.mark.slow

# A job that runs until the test cancels it: one worker (the fewest processes to start on a
# busy machine), tiny steps, a checkpoint every 10 so a killed worker restarts from it.
LONG = {
    "name": "ui-live",
    "model": {"preset": "gpt-tiny"},
    "data": {"seq_len": 16, "num_samples": 512},
    "resources": {"workers": 1},
    "train": {"steps": 20000, "global_batch_size": 4, "micro_batch_size": 2, "lr": 3e-3},
    "checkpoint": {"every_steps": 10},
}
# Wider than an 800px window in the jobs table.
LONG_NAME = "narrow-window-a-job-name-long-enough-to-widen"


def _short(name: str) -> dict:
    return {**LONG, "name": name, "train": {**LONG["train"], "steps": 5}}


def _points(tab, chart: str) -> int:
    return tab.page.evaluate(
        "id => document.querySelector(`#${id} polyline.series`).points.numberOfItems", chart
    )


def _wait_points(tab, chart: str, more_than: int, timeout_s: float = 180) -> int:
    tab.page.wait_for_function(
        "([id, n]) => document.querySelector(`#${id} polyline.series`).points.numberOfItems > n",
        arg=[chart, more_than],
        timeout=timeout_s * 1000,
    )
    return _points(tab, chart)


def _train_workers(served, job_id: str) -> list[psutil.Process]:
    """The Ray Train worker processes of one job."""
    with served.client() as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
    return job_processes(job, cmdline_has="RayTrainWorker")


@pytest.fixture(scope="module")
def quiet_job(served):
    """An admin job with a long name, cancelled at once (it costs the cluster nothing)."""
    with served.client() as c:
        r = c.post("/v1/jobs", json=_short(LONG_NAME))
        assert r.status_code == 201, r.text
        job = r.json()
        c.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()
    return job


def test_sign_in_refuses_a_wrong_token_and_then_shows_the_jobs(served, open_tab):
    tab = open_tab()
    tab.page.goto(f"{served.url}/")  # -> /ui/ -> no token -> sign-in
    tab.page.wait_for_url("**/ui/signin**")
    tab.page.fill("#token", "et_not-a-real-token")
    tab.page.click("#signin-button")
    tab.page.wait_for_selector("#error:not([hidden])")
    assert "not valid" in tab.page.text_content("#error")
    assert tab.page.evaluate("sessionStorage.length") == 0
    tab.page.fill("#token", served.token)
    tab.page.click("#signin-button")
    tab.page.wait_for_selector("#jobs-table")
    assert tab.page.url.endswith("/ui/")
    tab.shot("jobs")
    tab.page.click("#signout")
    tab.page.wait_for_url("**/ui/signin")
    tab.page.goto(f"{served.url}/ui/cluster")
    tab.page.wait_for_url("**/ui/signin?next=%2Fui%2Fcluster")
    tab.check(allow=("status of 401",))  # the refused sign-in's own request


def test_a_job_submitted_from_the_plan_page_trains_live_restarts_and_is_cancelled(
    served, open_tab, waiter
):
    tab = open_tab()
    tab.sign_in(served.url, served.token)
    page = tab.page
    page.goto(f"{served.url}/ui/plan")
    page.fill("#spec", yaml.safe_dump(LONG))
    page.click("#plan-button")
    page.wait_for_selector("#result:not([hidden])")
    assert page.text_content("#verdict") == "fits"
    assert page.locator("#candidates-table tbody tr").count() >= 1
    assert page.locator("#plan-bars .seg").count() >= 4  # params, grads, optimizer, activations
    tab.shot("plan")
    page.click("#submit-button")
    page.wait_for_url("**/ui/jobs/j-*")
    job_id = page.url.rsplit("/", 1)[1]
    try:
        page.goto(f"{served.url}/ui/jobs")
        link = page.wait_for_selector(f"#jobs-table a[href='/ui/jobs/{job_id}']")
        row = page.locator("#jobs-table tr", has=page.locator(f"a[href='/ui/jobs/{job_id}']"))
        assert "ui-live" in row.text_content() and "ddp" in row.text_content()
        link.click()
        page.wait_for_selector("#chart-loss")
        first = _wait_points(tab, "chart-loss", 2, timeout_s=300)  # Ray starts the worker
        later = _wait_points(tab, "chart-loss", first + 2)
        assert later > first >= 3
        assert _points(tab, "chart-lr") > 0 and _points(tab, "chart-tokens") > 0
        page.hover("#chart-loss", position={"x": 300, "y": 100})
        assert page.text_content("#chart-loss .hover text").startswith("step ")
        tab.shot("job-training")
        page.wait_for_selector("#chart-loss .marker-checkpoint", state="attached", timeout=120_000)
        workers = waiter(lambda: _train_workers(served, job_id), what="the job's Ray Train workers")
        os.kill(workers[0].pid, signal.SIGKILL)
        page.wait_for_selector("#chart-loss .marker-restart", state="attached", timeout=180_000)
        page.wait_for_selector("#events-table .kind-worker_failed")
        _wait_points(tab, "chart-loss", _points(tab, "chart-loss"))  # trains on after it
        page.wait_for_selector("#memory-bars .seg")
        page.wait_for_selector("#goodput-bar .seg")
        assert page.text_content("#logs").strip()
        tab.shot("job-restarted")
        page.once("dialog", lambda d: d.accept())
        page.click("#cancel")
        page.wait_for_selector("#job-status .status-cancelled", timeout=60_000)
        page.wait_for_selector("#cancel", state="hidden")
        tab.shot("job-cancelled")
    finally:
        with served.client() as c:
            c.post(f"/v1/jobs/{job_id}/cancel")
            status = c.get(f"/v1/jobs/{job_id}").json()["status"]
    assert status == "CANCELLED"
    tab.check()


def test_the_plan_page_names_the_field_of_a_refused_spec(served, open_tab):
    tab = open_tab()
    tab.sign_in(served.url, served.token)
    tab.page.goto(f"{served.url}/ui/plan")
    bad = {**LONG, "train": {**LONG["train"], "global_batch_size": 5}}
    tab.page.fill("#spec", yaml.safe_dump(bad))
    tab.page.click("#plan-button")
    tab.page.wait_for_selector("#error:not([hidden])")
    assert "train.global_batch_size" in tab.page.text_content("#error")
    assert tab.page.is_hidden("#result")
    tab.shot("plan-refused")
    tab.check(allow=("status of 422",))


# The mixed-GPU job planned for its cluster as a user pastes them: the spec as JSON, the
# cluster as YAML.
MIXED_CLUSTER = yaml.safe_dump(MIXED_GPU_CLUSTER, default_flow_style=None)


def test_the_plan_page_places_each_rank_on_a_cluster_of_mixed_gpus(served, open_tab):
    tab = open_tab()
    tab.sign_in(served.url, served.token)
    tab.page.goto(f"{served.url}/ui/plan")
    tab.page.fill("#spec", json.dumps(MIXED_GPU_JOB))
    tab.page.click("#cluster-details summary")
    tab.page.fill("#cluster", MIXED_CLUSTER)
    tab.page.click("#plan-button")
    tab.page.wait_for_selector("#placement-table")
    assert tab.page.text_content("#verdict") == "fits"
    rows = tab.page.locator("#placement-table tbody tr").all_inner_texts()
    cells = {row.split("\t")[0]: row.split("\t") for row in rows}
    assert cells["home-1"][3] == "0" and cells["home-2"][3] == "1"
    assert cells["laptop"][3] == "none fits"
    assert "laptop cannot hold a rank" in tab.page.text_content("#placement-summary")
    # The worst rank's bar is drawn against the GPU it runs on, not the laptop's.
    assert "of 24.0 GiB GPU memory" in tab.page.text_content("#plan-memory")
    tab.shot("plan-mixed-gpus")
    tab.check()


def test_a_second_tenant_sees_only_its_own_jobs(served, open_tab, quiet_job):
    with served.client() as admin:
        r = admin.post("/v1/tokens", json={"tenant": "ui-second", "name": "ui"})
        assert r.status_code == 201, r.text
    token = r.json()["token"]
    elastic = {**_short("ui-second-job"), "resources": {"workers": {"min": 1, "max": 2}}}
    with served.client(token) as c:
        r = c.post("/v1/jobs", json=elastic)
        assert r.status_code == 201, r.text
        own = r.json()
        c.post(f"/v1/jobs/{own['id']}/cancel").raise_for_status()
    tab = open_tab()
    tab.sign_in(served.url, token)
    tab.page.wait_for_selector(f"#jobs-table a[href='/ui/jobs/{own['id']}']")
    table = tab.page.text_content("#jobs-table")
    assert quiet_job["id"] not in table and LONG_NAME not in table
    assert tab.page.locator("#jobs-table tbody tr").count() == 1
    # Cancelled before it reported a size: the API's data-parallel range, not a guess.
    assert own["data_parallel"] == {"min": 1, "max": 2, "current": None}
    assert "dp=1–2" in table
    tab.shot("second-tenant")
    tab.page.select_option("#status-filter", "RUNNING")  # ?status=RUNNING: none of its jobs
    tab.page.wait_for_selector("#jobs-table td.empty")
    assert tab.page.url.endswith("/ui/?status=RUNNING")
    tab.page.select_option("#status-filter", "CANCELLED")
    tab.page.wait_for_selector(f"#jobs-table a[href='/ui/jobs/{own['id']}']")
    tab.page.goto(f"{served.url}/ui/jobs/{quiet_job['id']}")
    tab.page.wait_for_selector("#error:not([hidden])")
    assert "404" in tab.page.text_content("#error")
    assert LONG_NAME not in tab.page.content()
    tab.check(allow=("status of 404",))


def _overflow(tab) -> int:
    """Pixels the page is wider than the window (0: no horizontal page scroll)."""
    return tab.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def test_pages_fit_an_800px_window_with_wide_tables_scrolling(served, open_tab, quiet_job):
    tab = open_tab(width=800, height=900)
    tab.sign_in(served.url, served.token)
    tab.page.wait_for_selector(f"#jobs-table a[href='/ui/jobs/{quiet_job['id']}']")
    assert _overflow(tab) <= 0
    scroller = "document.querySelector('#jobs').firstElementChild"
    assert tab.page.evaluate(f"{scroller}.classList.contains('table-scroll')")
    assert tab.page.evaluate(f"{scroller}.scrollWidth > {scroller}.clientWidth")  # it scrolls
    tab.shot("jobs-800")
    tab.page.goto(f"{served.url}/ui/jobs/{quiet_job['id']}")
    tab.page.wait_for_selector("#events-table")
    tab.page.wait_for_selector("#job-status .status-cancelled")
    assert _overflow(tab) <= 0
    tab.shot("job-800")
    tab.page.goto(f"{served.url}/ui/cluster")
    tab.page.wait_for_selector("#nodes-table td:has-text('head')")
    # Each node's CPUs as free / total (the head's free count moves with the jobs).
    assert tab.page.locator("#nodes-table td", has_text=re.compile(r"^\d+ / \d+$")).count() >= 1
    assert tab.page.locator("#totals-table tr", has_text="CPU").count() >= 1
    # The session's service keeps the default standby driver: its line, which fits too.
    tab.page.wait_for_selector("#standby")
    assert tab.page.locator("#standby").inner_text().startswith("Standby job drivers: ")
    assert _overflow(tab) <= 0
    tab.shot("cluster-800")
    tab.page.goto(f"{served.url}/ui/plan")
    tab.page.wait_for_selector("#spec")
    assert _overflow(tab) <= 0
    tab.check()


def _gpu_node(node_id: str, ip: str, gib: int) -> dict:
    """A GPU node as the service's view of it answers (from what Ray lists), its GPUs'
    memory given by the operator's label (Ray cannot read it here: there are no GPUs)."""
    return NodePublic(
        **{
            "node_id": node_id,
            "ip": ip,
            "is_head": False,
            "resources": {"CPU": 8.0, "GPU": 1.0},
            "available": {"CPU": 8.0, "GPU": 1.0},
            "gpus": [],
            "labels": {GPU_MEMORY_LABEL: str(gib)},
        }
    ).model_dump(mode="json")


def test_the_cluster_page_shows_each_nodes_gpu_memory_and_the_mixed_sizes(served, open_tab):
    """The session's cluster has no GPUs: the page is handed the service's own /v1/cluster
    answer with two GPU nodes of different sizes added as Ray lists them, and the
    ``gpu_nodes`` the service computes for them."""
    with served.client() as c:
        real = c.get("/v1/cluster").json()
    nodes = [
        *real["nodes"],
        _gpu_node("a" * 56, "198.18.7.2", 24),
        _gpu_node("b" * 56, "198.18.7.3", 12),
    ]
    mixed = {**real, "nodes": nodes, "gpu_nodes": cluster_from_nodes(nodes)["gpu_nodes"]}
    tab = open_tab()
    tab.page.route("**/v1/cluster", lambda route: route.fulfill(json=mixed))
    tab.sign_in(served.url, served.token)
    tab.page.goto(f"{served.url}/ui/cluster")
    tab.page.wait_for_selector("#mixed-gpus")
    rows = tab.page.locator("#nodes-table tbody tr")
    memory = {
        r[1]: r[5]
        for r in (rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count()))
    }
    assert memory["198.18.7.2"] == "24.0 GiB (label)" and memory["198.18.7.3"] == "12.0 GiB (label)"
    assert memory[real["nodes"][0]["ip"]] == "–"  # the head: no GPUs
    line = tab.page.locator("#mixed-gpus").inner_text()
    assert "198.18.7.2/aaaaaaaa: 1 × 24 GiB" in line and "198.18.7.3/bbbbbbbb: 1 × 12 GiB" in line
    assert "smallest (12 GiB)" in line
    tab.check()
