"""``/openapi.json`` documents what every route takes and answers."""

from __future__ import annotations

import pytest

from service.api.app import create_app
from tests.support.fakes import FakeBackend, dev_settings
from workers.contract import TELEMETRY_ROUTE

# Routes that answer text, not JSON, and the media type each must declare.
TEXT_ROUTES = {("get", "/metrics"): "text/plain", ("get", "/v1/jobs/{job_id}/logs"): "text/plain"}


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> dict:
    app = create_app(
        dev_settings(tmp_path_factory.mktemp("openapi")), backend=FakeBackend(), reconcile=False
    )
    return app.openapi()


def _operations(document: dict):
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            yield method, path, op


def _resolve(document: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    assert ref.startswith("#/components/schemas/"), ref
    return document["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_every_success_answer_has_a_schema(document):
    checked = 0
    for method, path, op in _operations(document):
        success = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert success, f"{method.upper()} {path} documents no 2xx answer"
        for code, response in success.items():
            content = response.get("content") or {}
            if code == "204":  # No Content, by definition
                assert not content, f"{method.upper()} {path} 204 declares a body"
                continue
            if (method, path) in TEXT_ROUTES:
                media = [m for m in content if m.startswith(TEXT_ROUTES[method, path])]
                assert media, f"{method.upper()} {path} {code} must declare a text media type"
                assert content[media[0]]["schema"] == {"type": "string"}
                continue
            schema = _resolve(document, content["application/json"]["schema"])
            # Not {} or a bare object: the fields of the answer are named and typed.
            assert schema.get("properties"), f"{method.upper()} {path} {code}: {schema}"
            checked += 1
    assert checked >= 15


def test_every_reference_resolves(document):
    schemas = document["components"]["schemas"]
    for ref in set(_refs(document)):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[-1] in schemas, ref


def test_the_bodies_routes_decode_themselves_are_documented(document):
    def body(method: str, path: str) -> dict:
        return document["paths"][path][method]["requestBody"]["content"]

    assert (
        _resolve(document, body("post", "/v1/jobs")["application/json"]["schema"])["title"]
        == "JobSpec"
    )
    assert "application/yaml" in body("post", "/v1/jobs")
    plan = body("post", "/v1/plan")["application/json"]["schema"]
    assert set(plan["properties"]) == {"spec", "cluster"}
    telemetry = body("post", TELEMETRY_ROUTE)["application/json"]["schema"]
    assert _resolve(document, telemetry)["title"] == "TelemetryBatch"
