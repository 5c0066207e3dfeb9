"""A minimal receiver of the telemetry protocol, for runs without the control plane.

Benchmarks and integration tests point ``ETRAIN_REPORT_URL`` at it to see what
the workers and the Ray Train controller report (metrics, events, checkpoints),
exactly as the service's ``POST /v1/jobs/{id}/telemetry`` would receive it: each
batch is validated with the contract's ``TelemetryBatch`` (a 422 otherwise, as the
service answers), so a test fails when the workers send what the service would refuse.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import ValidationError

from workers.contract import TelemetryBatch


class TelemetrySink:
    """A real HTTP endpoint on loopback (or at ``host``, one of this machine's addresses)
    that records every posted batch."""

    def __init__(self, host: str = "127.0.0.1"):
        self.batches: list[dict] = []
        self.refused: list[str] = []  # why each refused batch was refused
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    TelemetryBatch.model_validate(body)
                except ValidationError as e:
                    with sink._lock:
                        sink.refused.append(str(e))
                    self.send_response(422)
                    self.end_headers()
                    return
                with sink._lock:
                    sink.batches.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), **body}
                    )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"accepted": 0}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def items(self, key: str, job_id: str) -> list[dict]:
        """Every posted item of one kind (metrics, events, checkpoints) for ``job_id``."""
        with self._lock:
            batches = list(self.batches)
        return [
            i
            for b in batches
            if b["path"] == f"/v1/jobs/{job_id}/telemetry"
            for i in b.get(key, [])
        ]

    def losses(self, job_id: str) -> dict[int, float]:
        """Loss per step; a recomputed step keeps its latest value (as the store does)."""
        return {m["step"]: m["loss"] for m in self.items("metrics", job_id)}

    def eval_losses(self, job_id: str) -> dict[int, float]:
        """Held-out loss per step that evaluated (the newest value of a recomputed step)."""
        return {
            m["step"]: m["eval_loss"] for m in self.items("metrics", job_id) if "eval_loss" in m
        }

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
