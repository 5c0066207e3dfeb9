"""workers.warm_spares without Ray: the switch, the spare files, the hook's gate.

The real thing (spares started by the raylet, used by a restarted group, ended
with the job) is tests/integration/test_warm_spares_ray.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workers import warm_spares

ROOT = Path(__file__).resolve().parents[3]


def test_spares_are_on_unless_the_spec_turns_them_off():
    from workers.spec import FailureSpec

    assert FailureSpec().warm_spares
    assert not FailureSpec(warm_spares=False).warm_spares


def test_only_running_spares_count_and_dead_ones_are_forgotten(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        node = tmp_path / "job" / "node"
        node.mkdir(parents=True)
        (node / f"{alive.pid}.ready").touch()
        (node / f"{dead.pid}.ready").touch()
        (node / f"{alive.pid + 100000}.warming").touch()  # no such process
        assert warm_spares.spares_in(tmp_path) == [alive.pid]
        assert not (node / f"{dead.pid}.ready").exists()
        assert warm_spares.spares_in(tmp_path, states=(warm_spares.WARMING,)) == []
    finally:
        alive.kill()
        alive.wait()


def test_the_hook_imports_nothing_outside_training_workers():
    """The controller and Ray's helper actors run the hook too: it must stay a no-op there."""
    code = ("import sys; from workers import warm_spares; warm_spares.setup_hook(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin", "PYTHONPATH": str(ROOT)}, check=True)
    assert out.stdout.strip() == "False"


def test_the_hook_warms_every_module_a_restarted_worker_needs(monkeypatch, tmp_path):
    monkeypatch.setenv(warm_spares.WARM_ENV, "1")
    monkeypatch.setattr(warm_spares, "_spare_dir", lambda: tmp_path)
    warm_spares.setup_hook()
    assert all(name in sys.modules for name in warm_spares.WARM_MODULES)
    assert [p.name for p in tmp_path.iterdir()] == [f"{warm_spares.os.getpid()}.ready"]
    warm_spares.claim()
    assert [p.name for p in tmp_path.iterdir()] == [f"{warm_spares.os.getpid()}.worker"]


def test_no_spares_are_asked_for_outside_marked_workers(monkeypatch):
    """Only the driver's worker_runtime_env marks workers; without it top_up does nothing."""
    monkeypatch.setattr(warm_spares, "_prestart", lambda n: (_ for _ in ()).throw(AssertionError))
    monkeypatch.delenv(warm_spares.WARM_ENV, raising=False)
    assert warm_spares.top_up() == 0


def test_one_worker_per_node_asks_for_the_missing_spares_and_never_raises(
        monkeypatch, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setenv(warm_spares.WARM_ENV, "1")
        monkeypatch.setattr(warm_spares, "_spare_dir", lambda: tmp_path)
        monkeypatch.setattr(warm_spares, "_LEADER_LOCK", None)
        asked = []
        monkeypatch.setattr(warm_spares, "_prestart", asked.append)
        warm_spares.claim()  # this process: a worker of the node
        (tmp_path / f"{sleeper.pid}.worker").touch()  # a second worker of the node
        assert warm_spares.top_up() == 2 and asked == [2]
        # The node has its leader (this process holds leader.lock): nobody else asks.
        assert warm_spares.top_up() == 0 and asked == [2]

        warm_spares._LEADER_LOCK.close()  # the leader dies; the next group elects another
        warm_spares._LEADER_LOCK = None
        (tmp_path / f"{sleeper.pid}.ready").touch()  # one spare still alive
        assert warm_spares.top_up() == 1 and asked == [2, 1]

        warm_spares._LEADER_LOCK.close()
        warm_spares._LEADER_LOCK = None

        def refused(n):
            raise RuntimeError("raylet unreachable")

        monkeypatch.setattr(warm_spares, "_prestart", refused)
        assert warm_spares.top_up() == 0
    finally:
        if warm_spares._LEADER_LOCK is not None:
            warm_spares._LEADER_LOCK.close()
        sleeper.kill()
        sleeper.wait()
