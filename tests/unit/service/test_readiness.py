"""GET /readyz: ready only when the store answers and the backend could accept a job now."""

from __future__ import annotations

from tests.support.api import api_client
from tests.support.fakes import FakeBackend


def test_readyz_is_not_ready_while_the_job_api_cannot_take_a_job(tmp_path):
    backend = FakeBackend()
    with api_client(tmp_path, backend) as c:
        assert c.get("/readyz").json() == {"status": "ready"}
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
