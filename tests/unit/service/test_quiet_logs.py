"""No log line per HTTP request: not per cluster poll in the service's log, not per telemetry
post in a job's own logs (``etrain logs``)."""

from __future__ import annotations

import logging

import httpx
import pytest

from workers.telemetry.reporter import HTTP_CLIENT_LOGGERS


@pytest.fixture(autouse=True)
def _restore_levels():
    before = {n: logging.getLogger(n).level for n in HTTP_CLIENT_LOGGERS}
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def _requests(n: int) -> None:
    ok = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with httpx.Client(transport=ok) as client:
        for _ in range(n):
            client.get("http://ray.test:8265/nodes?view=summary")


def _http_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(HTTP_CLIENT_LOGGERS)]


def test_without_the_fix_httpx_logs_a_line_per_request(caplog):
    # What the service and the workers printed: the test below would catch it.
    caplog.set_level(logging.INFO)
    _requests(3)
    assert len(_http_lines(caplog)) == 3


def test_the_service_log_has_no_line_per_cluster_poll(caplog):
    from service.server import configure_logging

    configure_logging()
    caplog.set_level(logging.INFO)
    _requests(5)
    assert _http_lines(caplog) == []
    logging.getLogger("httpx").warning("a warning still shows")
    assert _http_lines(caplog) == ["a warning still shows"]


def test_a_job_log_has_no_line_per_telemetry_post(caplog):
    from workers.telemetry.reporter import TelemetryReporter

    reporter = TelemetryReporter(url=None, token=None, job_id="j-quiet")
    try:
        caplog.set_level(logging.INFO)
        _requests(5)
        assert _http_lines(caplog) == []
    finally:
        reporter.close()
