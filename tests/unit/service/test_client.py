"""EtrainClient against an httpx.MockTransport: requests sent and errors mapped."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from service.client import UNAUTHORIZED_MESSAGE, ClientError, EtrainClient, format_detail

JOB = {"id": "j-1", "name": "tiny", "status": "QUEUED"}


def _client(handler, token: str | None = "tok") -> tuple[EtrainClient, list[httpx.Request]]:
    """A client whose every request is recorded and answered by ``handler``."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return EtrainClient("http://etrain.test/", token, transport=httpx.MockTransport(record)), seen


def test_bearer_header_and_yaml_body_sent_as_is():
    client, seen = _client(lambda r: httpx.Response(201, json=JOB))
    assert client.submit_job(b"name: tiny\n", "application/yaml") == JOB
    req = seen[0]
    assert (req.method, req.url.path) == ("POST", "/v1/jobs")
    assert req.headers["authorization"] == "Bearer tok"
    assert req.headers["content-type"] == "application/yaml"
    assert req.content == b"name: tiny\n"


def test_no_authorization_header_without_token():
    client, seen = _client(
        lambda r: httpx.Response(200, json={"items": [], "total": 0}), token=None
    )
    client.list_jobs(status="RUNNING", limit=5)
    assert "authorization" not in seen[0].headers
    assert dict(seen[0].url.params) == {"status": "RUNNING", "limit": "5"}


def test_dict_body_is_sent_as_json():
    client, seen = _client(lambda r: httpx.Response(201, json=JOB))
    client.submit_job({"name": "x"})
    assert seen[0].headers["content-type"] == "application/json"
    assert json.loads(seen[0].content) == {"name": "x"}


def test_events_after_id_and_items_envelope():
    client, seen = _client(lambda r: httpx.Response(200, json={"items": [{"id": 4}]}))
    assert client.get_events("j-1", after_id=3) == [{"id": 4}]
    assert seen[0].url.path == "/v1/jobs/j-1/events"
    assert seen[0].url.params["after_id"] == "3"


def test_job_id_cannot_escape_its_path_segment():
    client, seen = _client(lambda r: httpx.Response(200, json=JOB))
    client.get_job("../admin")
    assert seen[0].url.raw_path == b"/v1/jobs/..%2Fadmin"


def test_plan_omits_cluster_when_not_given():
    client, seen = _client(lambda r: httpx.Response(200, json={"fits": True}))
    client.plan({"name": "x"})
    client.plan({"name": "x"}, {"nodes": 2})
    assert json.loads(seen[0].content) == {"spec": {"name": "x"}}
    assert json.loads(seen[1].content)["cluster"] == {"nodes": 2}


def test_stream_logs_yields_chunks_with_follow():
    chunks = [b"line 1\n", b"line 2\n"]
    client, seen = _client(lambda r: httpx.Response(200, content=iter(chunks)))
    assert list(client.stream_logs("j-1")) == ["line 1\n", "line 2\n"]
    assert seen[0].url.params["follow"] == "true"


def test_stream_logs_error_status_raises():
    client, _ = _client(lambda r: httpx.Response(404, json={"detail": "no such job"}))
    with pytest.raises(ClientError, match="job j-9 not found"):
        list(client.stream_logs("j-9"))


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, {"detail": "missing token"}, UNAUTHORIZED_MESSAGE),
        (404, {"detail": "Not Found"}, "job j-1 not found"),
        (409, {"detail": "already finished"}, "conflict: already finished"),
        (500, "boom", "HTTP 500: boom"),
    ],
)
def test_http_errors_map_to_messages(status, body, expected):
    response = (
        httpx.Response(status, json=body)
        if isinstance(body, dict)
        else httpx.Response(status, text=body)
    )
    client, _ = _client(lambda r: response)
    with pytest.raises(ClientError) as info:
        client.get_job("j-1")
    assert info.value.status_code == status
    assert str(info.value) == expected


def test_422_lists_each_field_error():
    detail = [
        {"loc": ["body", "train", "steps"], "msg": "Input should be greater than 0", "type": "x"},
        {"loc": ["body", "parallelism", "tp"], "msg": "reduce tp to <= 8"},
    ]
    client, _ = _client(lambda r: httpx.Response(422, json={"detail": detail}))
    with pytest.raises(ClientError) as info:
        client.submit_job({"name": "x"})
    assert "train.steps: Input should be greater than 0" in info.value.message
    assert "parallelism.tp: reduce tp to <= 8" in info.value.message


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("spec is empty", ["spec is empty"]),
        ([{"loc": [], "msg": "bad"}], ["bad"]),
        ([{"loc": ["body", "resources", 0, "min"], "msg": "m"}], ["resources.0.min: m"]),
        (
            {
                "message": "plan does not fit",
                "plan": {
                    "fits": False,
                    "errors": ["needs 90 GiB per rank"],
                    "recommendation": "use fsdp",
                },
            },
            ["plan does not fit", "plan error: needs 90 GiB per rank", "recommendation: use fsdp"],
        ),
        (
            {"message": "no room", "plan": {"fits": False, "errors": []}},
            ["no room", "plan: the job does not fit the cluster"],
        ),
        (None, []),
    ],
)
def test_format_detail_shapes(detail, expected):
    assert format_detail(detail) == expected


def test_transport_connect_error_message():
    def refuse(request):
        raise httpx.ConnectError("Connection refused", request=request)

    client, _ = _client(refuse)
    with pytest.raises(
        ClientError, match=r"cannot reach etrain at http://etrain.test: is `etrain serve` running\?"
    ):
        client.get_job("j-1")


def test_real_connection_refused():
    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        EtrainClient(f"http://127.0.0.1:{port}", None, timeout=5) as client,
        pytest.raises(ClientError) as info,
    ):
        client.list_jobs()
    assert info.value.status_code is None
    assert "is `etrain serve` running?" in info.value.message
