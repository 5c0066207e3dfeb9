"""A cap on request bodies, enforced before a route (or its authentication) reads one.

A declared ``Content-Length`` over the cap is answered 413 at once, before a byte
of the body is received; a body without one (chunked) is counted as it arrives
and refused at the first chunk that passes the cap. Either way no more than the
cap is ever held in memory for one request.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _too_large(max_bytes: int) -> str:
    return (
        f"request body is larger than {max_bytes} bytes; send a smaller body "
        "(the operator sets the limit with ETRAIN_MAX_BODY_BYTES)"
    )


class BodyLimit:
    """ASGI middleware: refuse request bodies longer than ``max_bytes`` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send, 413 if declared.isdigit() else 400)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        """``receive`` that raises 413 once the body passes the cap."""
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, _too_large(self.max_bytes))
            return message

        return counted

    async def _refuse(self, send: Send, status: int) -> None:
        detail = _too_large(self.max_bytes) if status == 413 else "invalid Content-Length header"
        body = json.dumps({"detail": detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
