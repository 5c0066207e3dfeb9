"""Property-based fuzzing of every operation from the served OpenAPI document (schemathesis).

Requests are generated from ``/openapi.json`` (valid and invalid bodies, query
parameters and path ids) and sent in-process over ASGI to the real app on a fake
backend, with the admin token. Every answer must be no 5xx, carry a documented
status code and content type, and match the documented schema of its body.
Bounded and seeded: a fixed number of examples per operation, derandomized.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from service.api.app import create_app
from tests.support.fakes import ADMIN, FakeBackend, dev_settings

EXAMPLES_PER_OPERATION = 30
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


# Built at collection: schemathesis reads the document over ASGI to generate the tests
# (pytest 9 has no room for its fixture-based loader). The data dir goes with the process.
_DATA_DIR = tempfile.TemporaryDirectory(prefix="etrain-fuzz-")
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    create_app(dev_settings(Path(_DATA_DIR.name)), backend=FakeBackend(), reconcile=False),
)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_documented(case):
    # follow=true streams until the job ends; the fake backend's jobs never do.
    if case.query and str(case.query.get("follow", "")).lower() in ("true", "1"):
        case.query["follow"] = "false"
    case.call_and_validate(headers={"Authorization": f"Bearer {ADMIN}"}, checks=CHECKS)
