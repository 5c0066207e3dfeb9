"""A small typed HTTP client for the etrain REST API (used by the `etrain` CLI).

It imports only httpx so that the CLI starts fast; it never imports torch, ray
or the server. Every failure surfaces as one ``ClientError`` whose message is
fit to show a user as-is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
UNAUTHORIZED_MESSAGE = (
    "unauthorized: set ETRAIN_TOKEN (etrain serve printed where the admin token is)"
)


class ClientError(Exception):
    """An API call failed; ``message`` is user-facing; ``status_code`` is None without a reply."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code

    def __str__(self) -> str:
        return self.message


def _format_loc(loc: Any) -> str:
    """Join a FastAPI error location, dropping the leading 'body' that says nothing to users."""
    parts = [str(p) for p in (loc if isinstance(loc, list | tuple) else [loc]) if p is not None]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts)


def _format_item(item: Any) -> str:
    """One validation error as ``field.path: message`` (or just the message without a location)."""
    if not isinstance(item, dict):
        return str(item)
    msg = str(item.get("msg") or item.get("message") or item)
    where = _format_loc(item.get("loc") or [])
    return f"{where}: {msg}" if where else msg


def format_detail(detail: Any) -> list[str]:
    """Turn an error body's ``detail`` into message lines.

    Accepts every shape the server sends: a FastAPI list of ``{"loc", "msg"}``
    items, a plain string, or ``{"message": ..., "plan": {...}}`` from a
    submit whose plan does not fit.
    """
    if detail is None:
        return []
    if isinstance(detail, str):
        return [detail]
    if isinstance(detail, list):
        return [_format_item(item) for item in detail]
    if isinstance(detail, dict):
        lines = [str(detail["message"])] if detail.get("message") else []
        if isinstance(detail.get("errors"), list):
            lines += [_format_item(e) for e in detail["errors"]]
        plan = detail.get("plan")
        if isinstance(plan, dict):
            lines += [f"plan error: {_format_item(e)}" for e in plan.get("errors") or []]
            if plan.get("fits") is False and not plan.get("errors"):
                lines.append("plan: the job does not fit the cluster")
            if plan.get("recommendation"):
                lines.append(f"recommendation: {plan['recommendation']}")
        return lines or [str(detail)]
    return [str(detail)]


def _error_detail(response: httpx.Response) -> Any:
    """The ``detail`` of an error response, or the whole body when it has none."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return body["detail"]
    return body


def _raise_for_status(response: httpx.Response, job_id: str | None) -> None:
    """Raise a ClientError with a clean message for any non-2xx response."""
    code = response.status_code
    if code < 400:
        return
    if code == 401:
        raise ClientError(UNAUTHORIZED_MESSAGE, code)
    if code == 404 and job_id is not None:
        raise ClientError(f"job {job_id} not found", code)
    lines = format_detail(_error_detail(response))
    if code == 422:
        raise ClientError("invalid request:\n" + "\n".join(f"  {line}" for line in lines), code)
    label = {403: "forbidden", 404: "not found", 409: "conflict"}.get(code, f"HTTP {code}")
    raise ClientError(f"{label}: {'; '.join(lines)}", code)


class EtrainClient:
    """Typed calls to the etrain REST API (``/v1``); one instance per CLI invocation."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30,
    ):
        self.url = url.rstrip("/")
        self._timeout = timeout
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, transport=transport, timeout=timeout
        )

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> EtrainClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, *, job_id: str | None = None, **kw: Any
    ) -> httpx.Response:
        """Send one request, translating transport failures and HTTP errors into ClientError."""
        try:
            response = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        _raise_for_status(response, job_id)
        return response

    def _unreachable(self, e: httpx.TransportError) -> ClientError:
        """The message for a request that got no response at all."""
        if isinstance(e, httpx.ConnectError):
            return ClientError(f"cannot reach etrain at {self.url}: is `etrain serve` running?")
        return ClientError(f"cannot reach etrain at {self.url}: {type(e).__name__}: {e}")

    @staticmethod
    def _job_path(job_id: str, suffix: str = "") -> str:
        # Quote so an id typed by a user can never escape its path segment.
        return f"/v1/jobs/{quote(job_id, safe='')}{suffix}"

    def submit_job(
        self, body: bytes | dict[str, Any], content_type: str = "application/json"
    ) -> dict[str, Any]:
        """POST /v1/jobs with a raw YAML/JSON body (sent as-is) or a dict (sent as JSON)."""
        if isinstance(body, dict):
            return self._request("POST", "/v1/jobs", json=body).json()
        return self._request(
            "POST", "/v1/jobs", content=body, headers={"Content-Type": content_type}
        ).json()

    def list_jobs(self, *, status: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """GET /v1/jobs; returns ``{"items": [...], "total": n}``."""
        params = {k: v for k, v in {"status": status, "limit": limit}.items() if v is not None}
        body = self._request("GET", "/v1/jobs", params=params).json()
        if isinstance(body, list):  # tolerate a bare list
            return {"items": body, "total": len(body)}
        return body

    def get_job(self, job_id: str) -> dict[str, Any]:
        """GET /v1/jobs/{id}."""
        return self._request("GET", self._job_path(job_id), job_id=job_id).json()

    def get_cluster(self) -> dict[str, Any]:
        """GET /v1/cluster: nodes, the queue, the warm pool of standby drivers."""
        return self._request("GET", "/v1/cluster").json()

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """POST /v1/jobs/{id}/cancel; the server treats repeats as no-ops."""
        return self._request("POST", self._job_path(job_id, "/cancel"), job_id=job_id).json()

    def get_events(self, job_id: str, *, after_id: int | None = None) -> list[dict[str, Any]]:
        """GET /v1/jobs/{id}/events, only those with an id above ``after_id`` when given."""
        params = {"after_id": after_id} if after_id is not None else {}
        path = self._job_path(job_id, "/events")
        body = self._request("GET", path, job_id=job_id, params=params).json()
        return body.get("items", []) if isinstance(body, dict) else body

    def get_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/jobs/{id}/checkpoints: committed checkpoints (step, uri, bytes, ...)."""
        path = self._job_path(job_id, "/checkpoints")
        body = self._request("GET", path, job_id=job_id).json()
        return body.get("items", []) if isinstance(body, dict) else body

    def get_metrics(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/jobs/{id}/metrics: every step's point (loss, lr, tokens/s, ...), ascending."""
        body = self._request("GET", self._job_path(job_id, "/metrics"), job_id=job_id).json()
        return body.get("items", []) if isinstance(body, dict) else body

    def get_memory(self, job_id: str) -> dict[str, Any]:
        """GET /v1/jobs/{id}/memory: per-rank measured bytes (``ranks[*].*_bytes``)."""
        return self._request("GET", self._job_path(job_id, "/memory"), job_id=job_id).json()

    def get_goodput(self, job_id: str) -> dict[str, Any]:
        """GET /v1/jobs/{id}/goodput: productive over wall time and its breakdown."""
        return self._request("GET", self._job_path(job_id, "/goodput"), job_id=job_id).json()

    def get_logs(self, job_id: str) -> str:
        """GET /v1/jobs/{id}/logs as text."""
        return self._request("GET", self._job_path(job_id, "/logs"), job_id=job_id).text

    def stream_logs(self, job_id: str) -> Iterator[str]:
        """Yield log text chunks from ``?follow=true`` until the server closes the stream."""
        # No read timeout: a quiet job may print nothing for minutes.
        timeout = httpx.Timeout(self._timeout, read=None)
        path = self._job_path(job_id, "/logs")
        try:
            params = {"follow": "true"}
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()  # the error body is needed for the message
                    _raise_for_status(response, job_id)
                yield from response.iter_text()
        except httpx.TransportError as e:
            raise self._unreachable(e) from e

    def plan(self, spec: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /v1/plan: a dry run of memory per rank, layout and warnings."""
        body: dict[str, Any] = {"spec": spec}
        if cluster is not None:
            body["cluster"] = cluster
        return self._request("POST", "/v1/plan", json=body).json()

    def create_token(self, tenant: str, name: str = "token") -> dict[str, Any]:
        """POST /v1/tokens (admin): a new user token of ``tenant`` (created if new)."""
        return self._request("POST", "/v1/tokens", json={"tenant": tenant, "name": name}).json()

    def list_tokens(self) -> list[dict[str, Any]]:
        """GET /v1/tokens: live tokens (id, tenant, name, role, created_at), never secrets."""
        return self._request("GET", "/v1/tokens").json()["items"]

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """DELETE /v1/tokens/{id}: revoke a token at once; returns the token revoked."""
        return self._request("DELETE", f"/v1/tokens/{quote(token_id, safe='')}").json()
