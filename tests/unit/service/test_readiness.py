"""GET /readyz: ready only when the store answers and the backend could accept a job now."""

from __future__ import annotations

from tests.support.api import api_client
from tests.support.fakes import FakeBackend


def test_readyz_is_not_ready_while_the_job_api_cannot_take_a_job(tmp_path):
    backend = FakeBackend()
    with api_client(tmp_path, backend) as c:
        # No standby drivers: ready, but a job would start cold.
        ready = {"status": "ready", "ready_for_fast_start": False, "role": "single", "leader": None}
        assert c.get("/readyz").json() == ready
        # The dashboard answers (ping passes), but its agent cannot start a job driver.
        backend.not_ready_reason = "the Ray head's dashboard agent serves no HTTP"
        r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json() == {
            "status": "unavailable",
            "reason": "the Ray head's dashboard agent serves no HTTP",
        }
        backend.not_ready_reason = None
        assert c.get("/readyz").status_code == 200


def test_readyz_says_ready_for_fast_start_once_a_standby_is_warm_and_idle(tmp_path):
    from service.backends.standby import StandbyDrivers
    from tests.unit.service.test_standby import Clock, Ray, _req

    ray, backend = Ray(), FakeBackend()
    backend.standby = StandbyDrivers(
        ray.start, ray.stop, count=1, workers=2, report_url="http://cp", clock=Clock()
    )
    with api_client(tmp_path, backend) as c:
        fast = lambda: c.get("/readyz").json()["ready_for_fast_start"]  # noqa: E731
        backend.standby.keep()
        assert not fast()  # started, still warming
        standby_id, token = ray.token(next(iter(ray.started)))
        backend.standby.fetch(standby_id, token, wait_s=0)  # it asks: warm
        assert fast()
        backend.standby.take(_req())  # running a job: the next job would start cold
        assert not fast()
