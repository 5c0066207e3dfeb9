"""Item 3, the embedded Ray head's environment: the head (and so every job's driver and
workers) must not inherit the service's secrets. Each case starts the real ``EmbeddedRay``
the way ``etrain serve`` does, with the secret in the service's environment, and records the
environment it hands to ``ray start`` (no process is started)."""

from __future__ import annotations

import subprocess
import types

import pytest

from service.backends import embedded
from service.backends.embedded import EmbeddedRay


class _Recorded(Exception):
    pass


CASES = [
    pytest.param("ETRAIN_ADMIN_TOKEN", "et_admin-secret", id="item03-admin-token"),
    pytest.param("AWS_SECRET_ACCESS_KEY", "service-aws-secret", id="item03-service-aws-keys"),
    pytest.param("AWS_ACCESS_KEY_ID", "AKIASERVICE000000001", id="item03-service-aws-key-id"),
    pytest.param(
        "ETRAIN_SECRET_TEAMB_SECRET_ACCESS_KEY", "team-b-key", id="item03-other-tenant-secret"
    ),
    pytest.param(
        "GOOGLE_APPLICATION_CREDENTIALS", "/keys/service.json", id="item03-google-credentials"
    ),
    pytest.param(
        "ETRAIN_DATABASE_URL", "postgresql://etrain:pw@db/etrain", id="item03-database-password"
    ),
]


@pytest.mark.parametrize(("name", "value"), CASES)
def test_the_embedded_head_does_not_inherit_the_services_secrets(
    name, value, tmp_path, monkeypatch
):
    monkeypatch.setenv(name, value)
    handed: dict[str, str] = {}

    def popen(cmd, *, env=None, **_):
        handed.update(env or {})
        raise _Recorded

    # Only the embedded module's view of subprocess: Ray's own imports keep the real one.
    fake = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    monkeypatch.setattr(embedded, "subprocess", fake)
    head = EmbeddedRay(data_dir=tmp_path, num_cpus=1)
    try:
        with pytest.raises(_Recorded):
            head.start()
    finally:
        head.stop()
    assert handed, "ray start was not reached"
    assert "PATH" in handed and handed.get("RAY_AUTH_MODE") == "token"  # what Ray needs
    assert name not in handed
    assert value not in handed.values()
