"""ensure_ray_token: keep a token the environment already names; create one otherwise."""

from __future__ import annotations

from service.backends.embedded import ensure_ray_token


def test_a_token_the_environment_names_is_kept(tmp_path, monkeypatch):
    given = tmp_path / "given"
    given.write_text("t0k3n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(given))
    assert ensure_ray_token(tmp_path / "data") == given
    assert not (tmp_path / "data" / "ray_auth_token").exists()


def test_without_one_a_private_token_file_is_created(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    path = ensure_ray_token(tmp_path / "data")
    assert path == tmp_path / "data" / "ray_auth_token"
    assert len(path.read_text()) == 64 and (path.stat().st_mode & 0o777) == 0o600
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path)
