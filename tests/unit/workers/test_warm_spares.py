"""workers.warm.spares without Ray: the switch, the spare files, the hook's gate.

The real thing (spares started by the raylet, used by a restarted group, ended
with the job) is tests/integration/test_warm_spares_ray.py.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.contract import STANDBY_ID_ENV, WARM_WORKER_ENV
from workers.elastic.callbacks import StartupTimes
from workers.warm import spares as warm_spares

NO_SUCH_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_spares_are_on_unless_the_spec_turns_them_off():
    from workers.spec import FailureSpec

    assert FailureSpec().warm_spares
    assert not FailureSpec(warm_spares=False).warm_spares


def test_only_running_spares_count_and_dead_ones_are_forgotten(tmp_path):
    node = tmp_path / "job" / "node"
    node.mkdir(parents=True)
    (node / f"{os.getpid()}.ready").touch()
    (node / f"{NO_SUCH_PID}.ready").touch()
    (node / f"{NO_SUCH_PID}.warming").touch()
    assert warm_spares.spares_in(tmp_path) == [os.getpid()]
    assert not (node / f"{NO_SUCH_PID}.ready").exists()
    assert warm_spares.spares_in(tmp_path, states=(warm_spares.WARMING,)) == []
    assert not (node / f"{NO_SUCH_PID}.warming").exists()


@pytest.fixture
def imports(monkeypatch):
    """Every module the hook imports, recorded (and really imported)."""
    seen: list[str] = []

    def record(name: str):
        seen.append(name)
        return importlib.import_module(name)

    monkeypatch.setattr(warm_spares, "importlib", SimpleNamespace(import_module=record))
    return seen


def test_the_hook_gives_the_run_actors_ray_train_and_the_first_of_them_torch(
    monkeypatch, tmp_path, imports
):
    """The controller and Ray Train's other actors run the hook too: they import Ray Train's
    modules and are no spares. The job's first RUN_ACTORS on the node (the controller's
    process among them) also import what unpickling the controller's arguments does (torch);
    later ones (a restarted group's sync actor) not."""
    monkeypatch.delenv(WARM_WORKER_ENV, raising=False)
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    warm_spares.setup_hook()
    assert imports == [*warm_spares.RUN_ACTOR_IMPORTS, *warm_spares.CONTROLLER_IMPORTS]
    assert "workers.train_loop" not in imports
    assert all(name in sys.modules for name in imports)
    me = os.getpid()
    assert _files(tmp_path) == {f"started/{me}", f"run-actors/{me}"}  # no spare file

    for pid in range(1, warm_spares.RUN_ACTORS):  # the run's other actors started
        (tmp_path / "run-actors" / str(pid)).touch()
    imports.clear()
    monkeypatch.setattr(os, "getpid", lambda: me + 1)  # one more run-actor process
    warm_spares.setup_hook()
    assert imports == list(warm_spares.RUN_ACTOR_IMPORTS)


def test_once_the_controller_is_here_no_later_run_actor_imports_torch(
    monkeypatch, tmp_path, imports
):
    """A fresh start: the controller's process was the job's first run actor, and the
    processes Ray Train starts for its coordinator, state actor and cleaner once the
    controller unpickled its arguments are among the first RUN_ACTORS too: they need no
    torch."""
    monkeypatch.delenv(WARM_WORKER_ENV, raising=False)
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    monkeypatch.setattr(warm_spares, "ray_node_id", lambda: "node-a")
    pickle.loads(pickle.dumps(StartupTimes()))  # as the controller gets its callbacks
    assert (tmp_path / warm_spares.CONTROLLER_HERE).exists()
    warm_spares.setup_hook()  # the second run-actor process on the node
    assert imports == list(warm_spares.RUN_ACTOR_IMPORTS)


def test_unpickled_outside_ray_the_callbacks_mark_nothing(monkeypatch, tmp_path):
    """No Ray connection, no mark, and no local Ray started to find one."""
    import ray

    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    pickle.loads(pickle.dumps(StartupTimes()))
    assert not ray.is_initialized()
    assert not (tmp_path / warm_spares.CONTROLLER_HERE).exists()


def test_the_hook_warms_every_module_a_restarted_worker_needs(gcs, tmp_path, imports):
    warm_spares.setup_hook()
    assert imports == list(warm_spares.WARM_MODULES)
    assert all(name in sys.modules for name in warm_spares.WARM_MODULES)
    assert _files(tmp_path) == {f"{os.getpid()}.ready", f"started/{os.getpid()}"}
    warm_spares.claim()
    assert _files(tmp_path) == {f"{os.getpid()}.worker", f"started/{os.getpid()}"}


class Context:
    """This process as a Ray worker of job 02000000 on node-b."""

    def get_job_id(self):
        return "02000000"

    def get_node_id(self):
        return "node-b"


@pytest.fixture
def gcs(monkeypatch, tmp_path) -> set[str]:
    """The GCS key-value store's keys, for a spare of job 02000000 on node-b."""
    import ray

    store: set[str] = set()
    monkeypatch.setenv(WARM_WORKER_ENV, "1")
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(warm_spares, "kv_put", lambda key, namespace: store.add(key))
    monkeypatch.setattr(warm_spares, "kv_delete", lambda key, namespace: store.discard(key))
    monkeypatch.setattr(
        warm_spares, "kv_count", lambda prefix, namespace: sum(k.startswith(prefix) for k in store)
    )
    return store


def test_a_ready_spare_is_recorded_in_the_gcs_until_it_becomes_a_worker(gcs, imports):
    """A controller on another node cannot read this node's files: it counts the keys."""
    warm_spares.setup_hook()
    assert gcs == {f"02000000/node-b/{os.getpid()}"}
    assert warm_spares.ready_on("node-b") == 1 and warm_spares.ready_on("node-c") == 0
    warm_spares.claim()
    assert warm_spares.ready_on("node-b") == 0


def test_a_new_process_that_was_no_spare_claims_without_a_gcs_call(gcs, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(warm_spares, "kv_delete", lambda key, namespace: calls.append(key))
    warm_spares.claim()  # no setup hook ran here: never a ready spare
    assert calls == [] and _files(tmp_path) == {f"{os.getpid()}.worker"}


def test_a_spare_that_cannot_reach_the_gcs_is_still_a_spare(gcs, monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(warm_spares, "WARM_MODULES", ())

    def down(key, namespace):
        raise ConnectionError("GCS unavailable")

    monkeypatch.setattr(warm_spares, "kv_put", down)
    warm_spares.setup_hook()
    assert f"{os.getpid()}.ready" in _files(tmp_path) and not gcs
    assert "GCS unavailable" in caplog.text


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def node(monkeypatch, tmp_path):
    """This process as a worker of one node, with ``asked`` recording each spare request."""
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    monkeypatch.setattr(warm_spares, "_LEADER_LOCK", None)
    monkeypatch.setattr(warm_spares, "ray_node_id", lambda: "node-a")
    asked: list[int] = []  # spares asked for with the worker's own runtime environment

    def prestart_waves(requests):
        asked.extend(n for n, env in requests if env is None and n)

    monkeypatch.setattr(warm_spares, "prestart_waves", prestart_waves)
    yield tmp_path, asked
    if warm_spares._LEADER_LOCK is not None:
        warm_spares._LEADER_LOCK.close()


def test_no_spares_are_asked_for_outside_marked_workers(monkeypatch, node):
    """Only the driver's worker_runtime_env marks workers; without it top_up asks nothing."""
    folder, asked = node
    (folder / f"{os.getpid()}.worker").touch()  # a worker without a spare: one is missing
    monkeypatch.delenv(WARM_WORKER_ENV, raising=False)
    assert warm_spares.top_up() == 0 and asked == []
    monkeypatch.setenv(WARM_WORKER_ENV, "1")  # the same node, marked: the spare is asked for
    assert warm_spares.top_up() == 1 and asked == [1]


def test_one_worker_per_node_asks_for_the_missing_spares_and_never_raises(monkeypatch, node):
    folder, asked = node
    monkeypatch.setenv(WARM_WORKER_ENV, "1")
    warm_spares.claim()  # this process: a worker of the node
    (folder / f"{os.getppid()}.worker").touch()  # a second (running) worker of the node
    assert warm_spares.top_up() == 2 and asked == [2]
    # The node has its leader (this process holds leader.lock): nobody else asks.
    assert warm_spares.top_up() == 0 and asked == [2]

    warm_spares._LEADER_LOCK.close()  # the leader dies; the next group elects another
    warm_spares._LEADER_LOCK = None
    (folder / f"{os.getppid()}.ready").touch()  # one spare still alive
    assert warm_spares.top_up() == 1 and asked == [2, 1]

    warm_spares._LEADER_LOCK.close()
    warm_spares._LEADER_LOCK = None

    def refused(*a, **kw):
        raise RuntimeError("raylet unreachable")

    monkeypatch.setattr(warm_spares, "prestart_waves", refused)
    assert warm_spares.top_up() == 0


@pytest.mark.parametrize("here, asked_for_actors", [("node-a", True), ("node-b", False)])
def test_the_leader_on_the_controllers_node_also_readies_the_next_groups_run_actors(
    monkeypatch, tmp_path, here, asked_for_actors
):
    """Every group start creates Ray Train's sync actor, dataset manager and preemption
    watcher anew, each in a process of the controller's node."""
    monkeypatch.setenv(WARM_WORKER_ENV, "1")
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    monkeypatch.setattr(warm_spares, "_LEADER_LOCK", None)
    monkeypatch.setattr(warm_spares, "ray_node_id", lambda: here)
    monkeypatch.setattr(warm_spares, "_controller_env", lambda: "controller-env")
    asked: list[list] = []
    monkeypatch.setattr(warm_spares, "prestart_waves", asked.append)
    warm_spares.claim()
    assert warm_spares.top_up(controller_node="node-a") == 1
    actors = [(warm_spares.RUN_ACTORS_PER_GROUP, "controller-env")] if asked_for_actors else []
    assert asked == [[(1, None), *actors]]  # one request, in waves the raylet takes
    warm_spares._LEADER_LOCK.close()


def test_the_controllers_environment_is_the_workers_less_the_worker_marker(monkeypatch):
    import json

    import ray

    worker_env = {
        "env_vars": {"A": "1", WARM_WORKER_ENV: "1"},
        "worker_process_setup_hook": warm_spares.HOOK,
    }

    class Context:
        def get_runtime_env_string(self):
            return json.dumps(worker_env)

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    assert json.loads(warm_spares._controller_env()) == {
        "env_vars": {"A": "1"},
        "worker_process_setup_hook": warm_spares.HOOK,
    }
    assert " " not in warm_spares._controller_env()  # Ray's compact, sorted form


def test_the_training_thread_leaves_the_top_up_to_a_thread_of_its_own(monkeypatch):
    """After a group's first step the top-up's raylet and GCS calls run off the training
    thread, which goes on with step 2."""
    release, seen = threading.Event(), []

    def slow_top_up(controller_node=None):
        release.wait(5)  # a slow raylet
        seen.append((threading.current_thread().name, controller_node))

    monkeypatch.setattr(warm_spares, "top_up", slow_top_up)
    thread = warm_spares.top_up_in_background(controller_node="node-a")
    assert seen == [] and thread.is_alive() and thread.daemon  # returned at once
    release.set()
    thread.join(timeout=5)
    assert seen == [("etrain-top-up", "node-a")]


@pytest.mark.parametrize("cores, actors", [(2, False), (5, False), (6, True), (16, True)])
def test_the_first_group_gets_the_run_actors_ahead_only_where_cores_are_free_for_them(
    monkeypatch, cores, actors
):
    """2 workers + the 3 run actors + the driver: 6 processes in one wave, or the run
    actors (each importing torch) hold the cores the controller's start needs."""
    from workers.spec import JobSpec
    from workers.warm import first_group

    resources = JobSpec.model_validate({"name": "j", "resources": {"workers": 2}}).resources
    monkeypatch.setattr(first_group, "node_capacity", lambda n, **kw: n)
    monkeypatch.setattr(first_group.waves, "startup_concurrency", lambda: cores)
    asked: list = []
    monkeypatch.setattr(
        first_group, "prestart_for_run", lambda n, *, run_actors: asked.append((n, run_actors))
    )
    assert first_group.prestart_first_group(resources) == 2
    assert asked == [(2, actors)]
    asked.clear()
    # A standby driver's processes are this job's: one worker left to ask for.
    assert first_group.prestart_first_group(resources, already=1, run_actors=False) == 1
    assert asked == [(1, False)]


def test_a_standby_runs_tickets_make_later_run_actors_import_torch(monkeypatch, tmp_path, imports):
    """A standby driver runs job after job: the run-actor processes its run starts ahead for
    the next run, once this run's controller is here, import torch (any of them may become
    the next controller), as many as it left tickets for; then none again."""
    monkeypatch.delenv(WARM_WORKER_ENV, raising=False)
    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    (tmp_path / warm_spares.CONTROLLER_HERE).touch()
    assert warm_spares._ticket(2)
    me = os.getpid()
    # Outside a standby's Ray job no run-actor process looks for a ticket.
    monkeypatch.delenv(STANDBY_ID_ENV, raising=False)
    warm_spares.setup_hook()
    assert imports == [*warm_spares.RUN_ACTOR_IMPORTS]
    monkeypatch.setenv(STANDBY_ID_ENV, "sb-1")
    for n, torch in ((1, True), (2, True), (3, False)):
        imports.clear()
        monkeypatch.setattr(os, "getpid", lambda n=n: me + n)
        warm_spares.setup_hook()
        expected = [*warm_spares.RUN_ACTOR_IMPORTS]
        assert imports == expected + (list(warm_spares.CONTROLLER_IMPORTS) if torch else []), n
    assert not warm_spares._ticket(-1)


def test_only_a_workers_imports_may_pause(monkeypatch, tmp_path, imports):
    """A worker's process pauses while another job runs (speculation); a run-actor process
    never does: it may come to host Ray Train's cluster-wide actors, which every job's
    controller waits for (paused, they held a job of another standby for ever)."""
    import contextlib

    monkeypatch.setattr(warm_spares, "spare_dir", lambda: tmp_path)
    monkeypatch.setattr(warm_spares, "_announce", lambda ready: None)
    paused_in: list[list[str]] = []

    @contextlib.contextmanager
    def yielding():
        paused_in.append(imports)
        before = len(imports)
        yield
        paused_in[-1] = imports[before:]

    monkeypatch.setattr(warm_spares.speculation, "yielding", yielding)
    monkeypatch.delenv(WARM_WORKER_ENV, raising=False)
    warm_spares.setup_hook()  # a run actor
    assert paused_in == [] and imports
    imports.clear()
    monkeypatch.setenv(WARM_WORKER_ENV, "1")
    warm_spares.setup_hook()  # a worker
    assert paused_in == [list(warm_spares.WARM_MODULES)]
