"""Bearer tokens: hashing, authentication, revocation, the admin token and reporter scoping."""

from __future__ import annotations

import hashlib
import stat

import pytest
import sqlalchemy as sa

from service.auth import (
    ADMIN_TENANT,
    TOKEN_FILE,
    Principal,
    authenticate,
    create_reporter_token,
    create_user_token,
    ensure_admin_token,
    hash_token,
    new_token,
    require_user,
)
from service.errors import Forbidden, Unauthorized
from service.store import Stores, migrate
from workers.spec import JobSpec


def _token_rows(stores: Stores) -> list[dict]:
    """Every api_tokens row, read around the store."""
    engine = sa.create_engine(stores.url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM api_tokens"))]
    finally:
        engine.dispose()


def _job(stores: Stores, tenant_id: str) -> str:
    return stores.jobs.create_job(
        tenant_id=tenant_id,
        name="tiny",
        spec=JobSpec.model_validate({"name": "tiny"}),
        min_workers=2,
    ).id


def test_hash_token_is_sha256_hex():
    assert hash_token("et_abc") == hashlib.sha256(b"et_abc").hexdigest()
    assert hash_token("et_abc") != hash_token("et_abd")
    assert len(hash_token("")) == 64


def test_new_tokens_are_prefixed_random_and_long():
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(t.startswith("et_") and len(t) >= 40 for t in tokens)


@pytest.fixture
def sqlite_stores(tmp_path):
    """SQLite stores for checks that never reach the database's dialect."""
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    migrate(url)
    opened = Stores.open(url)
    yield opened
    opened.close()


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Basic dXNlcjpwYXNz", "Token abc", "bearerabc", "et_abc"],
    ids=["missing", "empty", "scheme-only", "basic", "other-scheme", "no-space", "no-scheme"],
)
def test_authenticate_rejects_missing_or_malformed_headers(sqlite_stores, header):
    token = create_user_token(sqlite_stores.tokens, tenant="acme", name="ci")
    for value in (header, None if header is None else header.replace("abc", token)):
        with pytest.raises(Unauthorized, match="Bearer"):
            authenticate(sqlite_stores.tokens, value)


def test_authenticate_rejects_unknown_token(stores):
    create_user_token(stores.tokens, tenant="acme", name="ci")
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        authenticate(stores.tokens, f"Bearer {new_token()}")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_user_token_authenticates_with_any_scheme_case(stores, scheme):
    token = create_user_token(stores.tokens, tenant="acme", name="ci")
    principal = authenticate(stores.tokens, f"{scheme} {token}")
    tenant = stores.tokens.get_tenant_by_name("acme")
    assert principal == Principal(tenant_id=tenant.id, role="user", job_id=None)
    assert require_user(principal) is principal


def test_user_tokens_share_an_existing_tenant(stores):
    a = authenticate(
        stores.tokens, f"Bearer {create_user_token(stores.tokens, tenant='acme', name='a')}"
    )
    b = authenticate(
        stores.tokens, f"Bearer {create_user_token(stores.tokens, tenant='acme', name='b')}"
    )
    c = authenticate(
        stores.tokens, f"Bearer {create_user_token(stores.tokens, tenant='globex', name='c')}"
    )
    assert a.tenant_id == b.tenant_id != c.tenant_id


def test_reporter_token_is_scoped_to_one_job(stores):
    tenant = stores.tokens.create_tenant("acme").id
    job_id = _job(stores, tenant)
    token = create_reporter_token(stores.tokens, tenant_id=tenant, job_id=job_id)
    principal = authenticate(stores.tokens, f"Bearer {token}")
    assert principal == Principal(tenant_id=tenant, role="reporter", job_id=job_id)
    # A reporter token may post telemetry, never call user routes.
    with pytest.raises(Forbidden):
        require_user(principal)


def test_revoked_reporter_tokens_no_longer_authenticate(stores):
    tenant = stores.tokens.create_tenant("acme").id
    job_id, other_job = _job(stores, tenant), _job(stores, tenant)
    first = create_reporter_token(stores.tokens, tenant_id=tenant, job_id=job_id)
    second = create_reporter_token(stores.tokens, tenant_id=tenant, job_id=job_id)
    other = create_reporter_token(stores.tokens, tenant_id=tenant, job_id=other_job)
    user = create_user_token(stores.tokens, tenant="acme", name="ci")

    assert stores.tokens.revoke_job_tokens(job_id) == 2
    for token in (first, second):
        with pytest.raises(Unauthorized, match="revoked"):
            authenticate(stores.tokens, f"Bearer {token}")
    # Other jobs' reporters and the tenant's user tokens are untouched.
    assert authenticate(stores.tokens, f"Bearer {other}").job_id == other_job
    assert authenticate(stores.tokens, f"Bearer {user}").role == "user"
    assert stores.tokens.revoke_job_tokens(job_id) == 0


def test_configured_admin_token_is_registered_and_idempotent(stores, tmp_path):
    secret = "et_configured-admin-token-value"
    assert ensure_admin_token(stores.tokens, configured=secret, data_dir=tmp_path) is None
    assert ensure_admin_token(stores.tokens, configured=secret, data_dir=tmp_path) is None
    principal = authenticate(stores.tokens, f"Bearer {secret}")
    assert principal.role == "admin"
    assert principal.tenant_id == stores.tokens.get_tenant_by_name(ADMIN_TENANT).id
    assert not (tmp_path / TOKEN_FILE).exists()  # nothing written when configured
    assert len([r for r in _token_rows(stores) if r["role"] == "admin"]) == 1


def test_generated_admin_token_file_is_private_and_reused(stores, tmp_path):
    data_dir = tmp_path / "data"  # does not exist yet
    path = ensure_admin_token(stores.tokens, configured=None, data_dir=data_dir)
    assert path == data_dir / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert token.startswith("et_")
    assert authenticate(stores.tokens, f"Bearer {token}").role == "admin"

    again = ensure_admin_token(stores.tokens, configured=None, data_dir=data_dir)
    assert again == path
    assert path.read_text().strip() == token
    assert len([r for r in _token_rows(stores) if r["role"] == "admin"]) == 1


def test_generated_admin_token_survives_a_new_store_on_the_same_database(stores, tmp_path):
    token_path = ensure_admin_token(stores.tokens, configured=None, data_dir=tmp_path)
    token = token_path.read_text().strip()
    restarted = Stores.open(stores.url)
    try:
        ensure_admin_token(restarted.tokens, configured=None, data_dir=tmp_path)
        assert authenticate(restarted.tokens, f"Bearer {token}").role == "admin"
    finally:
        restarted.close()


def test_no_plaintext_token_in_the_database(stores, tmp_path):
    configured = "et_plaintext-must-not-be-stored"
    ensure_admin_token(stores.tokens, configured=configured, data_dir=tmp_path)
    generated = (
        ensure_admin_token(stores.tokens, configured=None, data_dir=tmp_path).read_text().strip()
    )
    user = create_user_token(stores.tokens, tenant="acme", name="ci")
    tenant = stores.tokens.get_tenant_by_name("acme").id
    reporter = create_reporter_token(stores.tokens, tenant_id=tenant, job_id=_job(stores, tenant))

    rows = _token_rows(stores)
    dump = repr(rows)
    for token in (configured, generated, user, reporter):
        assert token not in dump
        assert hash_token(token) in {r["token_hash"] for r in rows}


def test_empty_admin_token_file_never_makes_an_empty_token_valid(stores, tmp_path):
    (tmp_path / TOKEN_FILE).write_text("\n")
    ensure_admin_token(stores.tokens, configured=None, data_dir=tmp_path)
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, "Bearer ")


def test_a_configured_admin_token_replaces_the_generated_one_and_back(stores, tmp_path):
    generated = ensure_admin_token(stores.tokens, configured=None, data_dir=tmp_path)
    old = generated.read_text().strip()
    ensure_admin_token(
        stores.tokens, configured="et_configured-admin-0123456789", data_dir=tmp_path
    )
    assert not generated.exists()  # it held a token that no longer works
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, f"Bearer {old}")
    # Configured A, then B, then A again: only the one in force works each time.
    ensure_admin_token(stores.tokens, configured="et_configured-admin-b", data_dir=tmp_path)
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, "Bearer et_configured-admin-0123456789")
    ensure_admin_token(
        stores.tokens, configured="et_configured-admin-0123456789", data_dir=tmp_path
    )
    assert authenticate(stores.tokens, "Bearer et_configured-admin-0123456789").role == "admin"
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, "Bearer et_configured-admin-b")
    live = [r for r in _token_rows(stores) if r["role"] == "admin" and r["revoked_at"] is None]
    assert len(live) == 1


def test_user_tokens_survive_a_new_admin_token(stores, tmp_path):
    ensure_admin_token(stores.tokens, configured="et_admin-one", data_dir=tmp_path)
    user = create_user_token(stores.tokens, tenant="acme", name="ci")
    ensure_admin_token(stores.tokens, configured="et_admin-two", data_dir=tmp_path)
    assert authenticate(stores.tokens, f"Bearer {user}").role == "user"


def test_no_user_token_for_a_reserved_tenant(sqlite_stores):
    with pytest.raises(ValueError, match="reserved"):
        create_user_token(sqlite_stores.tokens, tenant="admin", name="ci")
    assert sqlite_stores.tokens.list_tokens() == []


def test_a_verified_token_is_read_again_after_a_revocation_or_its_time(stores, monkeypatch):
    from service.store import tokens as token_store

    clock = [1000.0]
    monkeypatch.setattr(token_store.time, "monotonic", lambda: clock[0])
    tenant = stores.tokens.create_tenant("acme").id
    job_id = _job(stores, tenant)
    reporter = f"Bearer {create_reporter_token(stores.tokens, tenant_id=tenant, job_id=job_id)}"
    user = f"Bearer {create_user_token(stores.tokens, tenant='acme', name='ci')}"
    assert authenticate(stores.tokens, reporter).job_id == job_id  # now remembered
    # Revoked through this store: refused at once.
    stores.tokens.revoke_job_tokens(job_id)
    with pytest.raises(Unauthorized, match="revoked"):
        authenticate(stores.tokens, reporter)
    # Revoked by another replica (another store on the database): taken as live until the
    # time it was verified for runs out, then refused.
    assert authenticate(stores.tokens, user).role == "user"
    replica = Stores.open(stores.url)
    try:
        (token, _), *_ = [t for t in replica.tokens.list_tokens() if t[0].name == "ci"]
        assert replica.tokens.revoke_token(token.id) is not None
    finally:
        replica.close()
    clock[0] += token_store.VERIFIED_FOR_S - 0.01
    assert authenticate(stores.tokens, user).role == "user"
    clock[0] += 0.02
    with pytest.raises(Unauthorized, match="revoked"):
        authenticate(stores.tokens, user)
    # An unknown token is never remembered: it is refused, not verified.
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, "Bearer et_unknown")
    assert stores.tokens.verified_token(hash_token("et_unknown")) is None
