"""Request limits and the token lifecycle on a real `etrain serve` (uvicorn, real sockets).

Clients send 200 MB bodies, declared (413 before a byte is read) and chunked (401
without a token before the body is read; with one, 413 at the cap), and the
server's memory does not grow with them. The
database file is private, and a restart with a new admin token revokes the old one.
"""

from __future__ import annotations

import socket
import stat
from urllib.parse import urlsplit

import psutil

BIG = 200 * 1024 * 1024
CHUNK = b" " * (1024 * 1024)


def _send_raw(url: str, head: str, chunks: int, *, chunked: bool) -> str:
    """Send ``head`` and up to ``chunks`` MiB of body; return the status line answered."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head.encode())
        try:
            for _ in range(chunks):
                sock.sendall(b"100000\r\n" + CHUNK + b"\r\n" if chunked else CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what is wanted
        answer = sock.recv(4096).decode(errors="replace")
    return answer.split("\r\n", 1)[0]


def test_200mb_bodies_are_refused_before_they_are_read(served):
    rss = psutil.Process(served.proc.pid).memory_info().rss
    for _ in range(4):
        declared = (
            f"POST /v1/tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BIG}\r\n\r\n"
        )
        assert " 413 " in _send_raw(served.url, declared, 200, chunked=False)
        chunked = (
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n{auth}\r\n"
        )
        # No token: 401 before a byte of the body is read. A token: cut at the cap.
        assert " 401 " in _send_raw(served.url, chunked.format(auth=""), 200, chunked=True)
        auth = f"Authorization: Bearer {served.token}\r\n"
        assert " 413 " in _send_raw(served.url, chunked.format(auth=auth), 200, chunked=True)
    grown = psutil.Process(served.proc.pid).memory_info().rss - rss
    assert grown < 64 * 1024 * 1024, f"the server grew {grown / 2**20:.0f} MiB"
    with served.client() as api:  # and it still serves
        assert api.get("/v1/jobs").status_code == 200


def test_the_database_file_is_private(served):
    for path in served.data_dir.glob("etrain.db*"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_restart_with_a_new_admin_token_revokes_the_old_one(serve_factory, ray_backend, tmp_path):
    old, new = "et_e2e-old-admin-token-0123456789", "et_e2e-new-admin-token-0123456789"
    first = serve_factory(
        tmp_path, ray_address=ray_backend.address, extra_env={"ETRAIN_ADMIN_TOKEN": old}
    )
    try:
        with first.client(old) as api:
            assert api.get("/v1/tokens").status_code == 200
    finally:
        first.stop()
    second = serve_factory(
        tmp_path, ray_address=ray_backend.address, extra_env={"ETRAIN_ADMIN_TOKEN": new}
    )
    try:
        with second.client(new) as api:
            assert api.get("/v1/tokens").status_code == 200
        with second.client(old) as api:
            assert api.get("/v1/jobs").status_code == 401
    finally:
        second.stop()
