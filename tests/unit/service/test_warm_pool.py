"""The warm pool's budget (``warm_policy``) as the standby pool applies it, and one job's
part of a standby driver's log (``standby_logs``)."""

from __future__ import annotations

import asyncio

import pytest

from service.backends.standby import StandbyDrivers
from service.backends.standby_logs import follow_part, job_part
from service.backends.warm_policy import RUN_ACTORS, fit, processes_per_standby
from service.errors import BackendUnavailable
from service.settings.slices import WarmBudget
from tests.unit.service.test_standby import Clock, Ray, _req
from workers.contract import STANDBY_RUN_BEGIN, STANDBY_RUN_END, STANDBY_WORKERS_ENV
from workers.warm import spares


def test_the_policy_counts_the_run_actors_the_workers_start():
    assert RUN_ACTORS == spares.RUN_ACTORS
    assert processes_per_standby(2) == 1 + spares.RUN_ACTORS + 2


@pytest.mark.parametrize(
    "cpus, memory, processes, memory_bytes",
    [
        (2, 24e9, 6, 4_800_000_000),  # this machine: one standby with 2 workers fits
        (8, 64e9, 18, 12_800_000_000),
        (None, None, 4, 2 * 1024**3),  # unknown: the least
    ],
)
def test_an_unset_budget_is_sized_to_the_node(cpus, memory, processes, memory_bytes):
    sized = WarmBudget().for_node(cpus, memory)
    assert (sized.processes, sized.memory_bytes) == (processes, memory_bytes)
    assert WarmBudget(processes=3, memory_bytes=7).for_node(cpus, memory).processes == 3


@pytest.mark.parametrize(
    "processes, memory, memory_each, wanted, workers, expect",
    [
        (6, 10**10, None, 1, 2, (1, 2)),
        (5, 10**10, None, 1, 2, (1, 1)),  # fewer workers rather than over the budget
        (3, 10**10, None, 1, 2, (0, 0)),  # not even the driver and the run's actors fit
        (12, 10**10, None, 3, 2, (2, 2)),
        (12, 3 * 10**9, 2 * 10**9, 3, 2, (1, 2)),  # memory: one standby's report fits once
        (12, 1 * 10**9, 2 * 10**9, 3, 2, (0, 2)),
    ],
)
def test_fit_keeps_the_pool_within_both_budgets(
    processes, memory, memory_each, wanted, workers, expect
):
    budget = WarmBudget(processes, memory)
    assert fit(budget, wanted=wanted, workers=workers, memory_each=memory_each) == expect


def _pool(ray, clock, budget, count=1, node=None):
    return StandbyDrivers(
        ray.start,
        ray.stop,
        count=count,
        workers=2,
        report_url="http://cp:8080",
        budget=budget,
        node=node,
        clock=clock,
    )


def test_the_pool_starts_within_its_process_budget_and_shows_it():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, WarmBudget(processes=5, memory_bytes=10**10), count=2)
    pool.keep()
    (env,) = ray.started.values()  # 5 processes: one standby, with one worker
    assert env[STANDBY_WORKERS_ENV] == "1"
    status = pool.status()
    assert (status.processes, status.budget.processes, status.shrunk) == (5, 5, False)


def test_a_pool_over_its_memory_retires_idle_standbys_until_it_fits():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, WarmBudget(processes=100, memory_bytes=3 * 10**9), count=2)
    pool.keep()
    first, second = ray.started
    pool.fetch(*ray.token(first), wait_s=0, memory_bytes=2 * 10**9)  # warm, and heavy
    pool.keep()
    assert ray.stopped == [second]  # the one still warming goes; the warm one stays
    pool.keep()
    assert len(ray.started) == 2 and pool.status().idle == 1  # none started again


def test_an_idle_pool_stops_after_its_idle_time_and_a_job_brings_it_back():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, WarmBudget(processes=6, memory_bytes=10**10, idle_s=100))
    pool.keep()
    (first,) = ray.started
    clock.now += 50
    pool.fetch(*ray.token(first), wait_s=0)  # asks: alive, but no job came
    pool.keep()
    assert not ray.stopped
    clock.now += 51
    pool.keep()
    assert ray.stopped == [first] and pool.status().shrunk
    pool.keep()
    assert len(ray.started) == 1  # stays stopped while no job comes
    assert pool.take(_req()) is None  # a job came: it starts cold, and the pool comes back
    pool.keep()
    assert len(ray.started) == 2 and not pool.status().shrunk


def test_nothing_starts_before_the_node_is_known():
    ray, clock, answers = Ray(), Clock(), []

    def node():
        if not answers:
            raise BackendUnavailable("no head yet")
        return answers[0]

    pool = _pool(ray, clock, WarmBudget(), node=node)
    pool.keep()
    assert not ray.started and pool.status().budget is None
    answers.append((2.0, 24e9))
    pool.keep()
    assert len(ray.started) == 1 and pool.status().budget.processes == 6


# -- one job's part of a standby's log ---------------------------------------------------------

LOG = (
    "etrain: standby driver: 2 worker and 3 run actor process(es) warming\n"
    f"{STANDBY_RUN_BEGIN}etrain-a-0 (job a)\n"
    "(RayTrainWorker pid=1) step 1\n"
    "etrain: training finished\n"
    f"{STANDBY_RUN_END}etrain-a-0\n"
    "(RayTrainWorker pid=1) a late line of a\n"
    f"{STANDBY_RUN_BEGIN}etrain-a-1 (job a)\n"
    "(RayTrainWorker pid=2) step 1 of the resubmitted a\n"
    f"{STANDBY_RUN_BEGIN}etrain-b-0 (job b)\n"  # a-1's end line was lost (killed, say)
    "(RayTrainWorker pid=3) step 1 of b\n"
)


def test_a_job_sees_only_its_own_part_of_the_standby_log():
    a = job_part(LOG, "etrain-a-0")
    assert a.startswith(STANDBY_RUN_BEGIN) and a.endswith(f"{STANDBY_RUN_END}etrain-a-0\n")
    assert "step 1\n" in a and "warming" not in a and "late" not in a and "of b" not in a
    assert job_part(LOG, "etrain-a-1").count("\n") == 2  # up to the next job's first line
    assert job_part(LOG, "etrain-b-0").endswith("step 1 of b\n")
    assert job_part(LOG, "etrain-c-0") == ""


def test_following_a_job_stops_at_its_end_line_across_chunk_boundaries():
    async def chunks():
        for i in range(0, len(LOG), 7):  # cut anywhere, lines too
            yield LOG[i : i + 7]
        raise AssertionError("read past the job's end")

    async def follow():
        return "".join([c async for c in follow_part(chunks(), "etrain-a-0")])

    with pytest.raises(AssertionError):  # without an end line it would read on
        asyncio.run(_all(follow_part(chunks(), "etrain-b-0")))
    assert asyncio.run(follow()) == job_part(LOG, "etrain-a-0")


async def _all(stream):
    return [c async for c in stream]


def test_etrain_status_without_a_job_shows_the_pool_and_its_budget():
    from service.cli.jobs import cluster_lines

    cluster = {
        "nodes": [{}],
        "total": {"CPU": 2.0},
        "available": {"CPU": 1.0},
        "queue": [],
        "standby": {
            "configured": 1,
            "idle": 1,
            "warm": 1,
            "busy": 0,
            "processes": 6,
            "memory_bytes": 1_900_000_000,
            "budget": {"processes": 6, "memory_bytes": 4_800_000_000, "idle_s": 900.0},
            "shrunk": False,
        },
    }
    lines = cluster_lines(cluster)
    assert "CPUs       1 free of 2" in lines
    assert "warm pool  1 standby driver(s) kept: 1 warm, 0 warming, 0 running a job" in lines
    assert "  holds    6 processes, 1.90 GB of host memory (PSS)" in lines
    assert "  budget   6 processes, 4.80 GB; stops after 900 s without a job" in lines
    cluster["standby"]["shrunk"] = True
    assert "stopped after its idle time" in cluster_lines(cluster)[3]
    assert cluster_lines({**cluster, "standby": None})[-1].startswith("warm pool  none")
