"""TelemetryReporter against a real local HTTP endpoint that can go away and come back."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from workers.contract import EventKind, MetricPoint, TelemetryBatch
from workers.telemetry.reporter import TelemetryReporter


class Endpoint:
    """A loopback HTTP server recording posts; ``fail`` makes it answer 503."""

    def __init__(self):
        self.posts, self.fail = [], False
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code = 503 if outer.fail else 200
                if not outer.fail:
                    outer.posts.append((self.path, self.headers["Authorization"], body))
                self.send_response(code)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_batches_carry_token_and_survive_an_outage():
    ep = Endpoint()
    ep.fail = True
    r = TelemetryReporter(url=ep.url, token="secret-tok", job_id="j-1", flush_interval=0.05)
    for step in range(1, 4):
        r.metric(MetricPoint(step=step, world_size=2, loss=1.0))
    r.event(EventKind.RESTORED, "restored from step 2", dedup_key="k1")
    time.sleep(0.3)
    assert ep.posts == []  # the endpoint refused everything so far
    ep.fail = False
    r.close(timeout=5)
    steps = [m["step"] for _, _, b in ep.posts for m in b["metrics"]]
    assert steps == [1, 2, 3]
    assert all(
        path == "/v1/jobs/j-1/telemetry" and auth == "Bearer secret-tok"
        for path, auth, _ in ep.posts
    )
    events = [e for _, _, b in ep.posts for e in b["events"]]
    assert [(e["kind"], e["dedup_key"]) for e in events] == [("restored", "k1")]
    # What was posted is the contract's batch, exactly (no field the receiver would refuse).
    for _, _, body in ep.posts:
        assert TelemetryBatch.model_validate(body).model_dump(mode="json") == body
    ep.server.shutdown()


def test_without_url_prints_json_lines(capsys):
    r = TelemetryReporter(url=None, token=None, job_id="j-2", flush_interval=0.05)
    r.metric(MetricPoint(step=1, world_size=1))
    r.close()
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("ETRAIN_TELEMETRY "))
    assert json.loads(line.removeprefix("ETRAIN_TELEMETRY "))["metrics"] == {
        **MetricPoint(step=1, world_size=1).model_dump(),
        "step": 1,
        "world_size": 1,
    }


def test_flush_sends_now_and_reports_an_unreachable_control_plane():
    ep = Endpoint()
    r = TelemetryReporter(url=ep.url, token="t", job_id="j-3", flush_interval=60)
    r.metric(MetricPoint(step=1, world_size=2))
    r.metric(MetricPoint(step=2, world_size=2))
    assert r.flush(timeout=5) is True  # well before the 60 s batching interval
    assert [m["step"] for _, _, b in ep.posts for m in b["metrics"]] == [1, 2]
    ep.fail = True
    r.metric(MetricPoint(step=3, world_size=2))
    t0 = time.monotonic()
    assert r.flush(timeout=0.5) is False
    assert time.monotonic() - t0 < 2
    ep.fail = False
    assert r.flush(timeout=5) is True
    assert [m["step"] for _, _, b in ep.posts for m in b["metrics"]] == [1, 2, 3]
    r.close()
    ep.server.shutdown()


def test_a_backlog_is_sent_in_parts_under_the_body_limit():
    """After an outage the backlog goes in posts of at most 100 items, each far below the
    API's 1 MiB body limit, in order and complete."""
    ep = Endpoint()
    ep.fail = True
    r = TelemetryReporter(url=ep.url, token="t", job_id="j-1", flush_interval=0.05)
    for step in range(1, 1001):
        r.metric(MetricPoint(step=step, world_size=2, loss=1.0, tokens_per_s=1e6))
    time.sleep(0.3)
    ep.fail = False
    r.close(timeout=10)
    sizes = [TelemetryBatch.model_validate(b).size() for _, _, b in ep.posts]
    assert max(sizes) <= 100 and sum(sizes) == 1000
    assert max(len(json.dumps(b)) for _, _, b in ep.posts) < 64 * 1024
    assert [m["step"] for _, _, b in ep.posts for m in b["metrics"]] == list(range(1, 1001))
    ep.server.shutdown()


def test_the_first_metric_point_goes_out_at_once_the_rest_at_the_flush_interval():
    """Step 1 ends a job's start: its point does not wait out the batching interval."""
    ep = Endpoint()
    r = TelemetryReporter(url=ep.url, token="t", job_id="j-1", flush_interval=30)
    time.sleep(0.2)  # the sender is waiting out its interval
    t0 = time.monotonic()
    r.metric(MetricPoint(step=1, world_size=1, loss=1.0))
    while not ep.posts and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert [m["step"] for _, _, b in ep.posts for m in b["metrics"]] == [1]
    r.metric(MetricPoint(step=2, world_size=1, loss=1.0))
    time.sleep(0.5)
    assert len(ep.posts) == 1  # step 2 waits for the interval (or a flush)
    r.close(timeout=5)
    assert [m["step"] for _, _, b in ep.posts for m in b["metrics"]] == [1, 2]
    ep.server.shutdown()
