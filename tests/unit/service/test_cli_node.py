"""``etrain node join``: what it refuses before starting anything, and the ``ray start`` it
runs (the real join, from a network namespace of its own: tests/integration/test_elastic.py)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()


@pytest.fixture
def token(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    path = tmp_path / "ray_auth_token"
    path.write_text("a" * 64)
    return path


def _join(*args: str):
    return runner.invoke(app, ["node", "join", *args])


def _said(result) -> str:
    """The output without the error box rich draws around it (it wraps lines)."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", result.output)


def test_a_dry_run_prints_the_ray_start_it_would_run_and_never_the_token(token):
    result = _join(
        "--head",
        "10.10.0.1:6379",
        "--token-file",
        str(token),
        "--num-gpus",
        "1",
        "--gpu-memory-gb",
        "24",
        "--resources",
        '{"A10G": 1}',
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert " start --address=10.10.0.1:6379 --block " in line
    assert "--num-gpus=1" in line and '--resources={"A10G": 1}' in line
    assert "--labels=etrain.io/gpu-memory-gb=24" in line
    assert "a" * 64 not in result.output


@pytest.mark.parametrize(
    "args, field, says",
    [
        (["--head", "10.10.0.1"], "--head", "is not HOST:PORT"),
        (["--head", "h:1; rm -rf /"], "--head", "is not HOST:PORT"),
        (["--head", "h:6379", "--resources", "[1]"], "--resources", "a JSON object"),
        (["--head", "h:6379", "--resources", '{"GPU": -1}'], "--resources", "a JSON object"),
    ],
)
def test_bad_options_are_refused_naming_the_option(token, args, field, says):
    result = _join(*args, "--token-file", str(token), "--dry-run")
    assert result.exit_code == 2
    assert field in _said(result) and says in _said(result)


def test_a_join_needs_a_token(token, tmp_path):
    result = _join("--head", "h:6379", "--dry-run")
    assert result.exit_code == 2 and "--token-file" in result.output
    empty = tmp_path / "empty"
    empty.write_text("")
    for bad in (empty, tmp_path, tmp_path / "missing"):
        result = _join("--head", "h:6379", "--token-file", str(bad), "--dry-run")
        assert result.exit_code == 2 and "is not a token file" in _said(result)


# -- etrain node certs: Ray's TLS between nodes ----------------------------------------


def _certs(ca, out, *addresses: str):
    args = ["node", "certs", "--ca", str(ca), "--out", str(out)]
    return runner.invoke(app, [*args, *(a for addr in addresses for a in ("--address", addr))])


def _tls(server_dir, client_dir, host: str = "127.0.0.1") -> str:
    """A real mutual-TLS handshake as Ray's gRPC makes one: the server presents its node
    certificate and asks for the client's; each checks the other against its ca.crt, and
    the client checks that the certificate names the address it dialled. The server's
    error, or '' when both sides agreed."""
    import socket
    import ssl
    import threading

    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_dir / "node.crt", server_dir / "node.key")
    server.load_verify_locations(server_dir / "ca.crt")
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_cert_chain(client_dir / "node.crt", client_dir / "node.key")
    client.load_verify_locations(client_dir / "ca.crt")
    errors: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as e:
                errors.append(str(e))

        thread = threading.Thread(target=accept)
        thread.start()
        port = listener.getsockname()[1]
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client.wrap_socket(raw, server_hostname=host) as tls,
            ):
                tls.sendall(b"x")
        except (ssl.SSLError, OSError) as e:
            errors.append(f"client: {e}")
        thread.join(10)
    return "; ".join(errors)


def test_node_certs_share_one_ca_and_make_a_real_mutual_tls_handshake(tmp_path):
    ca = tmp_path / "ca"
    first = _certs(ca, tmp_path / "head", "198.18.0.1", "head.example")
    assert first.exit_code == 0, first.output
    assert f"made the cluster's CA in {ca}" in first.output
    assert f"export RAY_TLS_SERVER_CERT={tmp_path / 'head' / 'node.crt'}" in first.output
    assert "export RAY_USE_TLS=1" in first.output and "PRIVATE KEY" not in first.output
    second = _certs(ca, tmp_path / "node", "198.18.0.2")
    assert second.exit_code == 0 and "made the cluster's CA" not in second.output
    for node in ("head", "node"):
        files = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / node).iterdir()}
        assert files == {"node.crt": 0o644, "node.key": 0o600, "ca.crt": 0o644}  # no ca.key
    assert (ca / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "head" / "ca.crt").read_bytes() == (ca / "ca.crt").read_bytes()

    # One CA: both ways accepted; at 127.0.0.1, which every certificate names (each node's
    # Ray processes dial their own agents there), and at a name given.
    assert _tls(tmp_path / "head", tmp_path / "node") == ""
    assert _tls(tmp_path / "head", tmp_path / "node", host="head.example") == ""
    # The head's certificate does not name 198.18.0.9: a client that dialled it refuses.
    assert "client:" in _tls(tmp_path / "head", tmp_path / "node", host="198.18.0.9")
    # A node of another cluster's CA is refused by the server.
    assert _certs(tmp_path / "other-ca", tmp_path / "stranger", "127.0.0.1").exit_code == 0
    assert _tls(tmp_path / "head", tmp_path / "stranger") != ""


def test_node_certs_need_an_address():
    result = runner.invoke(app, ["node", "certs", "--out", "x"])
    assert result.exit_code != 0 and "--address" in _said(result)
