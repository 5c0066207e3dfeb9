"""The ``etrain`` CLI talking to an app served in this process (a FastAPI TestClient)."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient
from rich.console import Console

from service import cli


def bridge_cli(monkeypatch, client: TestClient) -> None:
    """Send the CLI's requests to ``client``'s app, and print wide (no wrapped lines)."""

    def forward(request: httpx.Request) -> httpx.Response:
        reply = client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.content,
            headers=dict(request.headers),
        )
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)

    monkeypatch.setattr(cli, "_transport", lambda: httpx.MockTransport(forward))
    monkeypatch.setattr(cli, "console", Console(width=300, highlight=False))
    monkeypatch.setattr(cli, "err_console", Console(width=300, stderr=True, highlight=False))
