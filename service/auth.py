"""Bearer API tokens: generated once, stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from service.errors import Forbidden, Unauthorized
from service.store import TokenRecord, TokenStore

ADMIN_TENANT = "admin"
# Tenant names a user token may not be created for: the bootstrap admin token's tenant
# (a user token there would list and revoke the admin token). Reporter tokens belong to
# their job's tenant, standby drivers' tokens are not in the token store, and a metrics
# scrape is judged by its token's role, so no other name is the service's own.
RESERVED_TENANTS = frozenset({ADMIN_TENANT})
TOKEN_FILE = "admin_token"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, with a role and (for reporters) the one job it may touch."""

    tenant_id: str
    role: str  # admin | user | reporter
    job_id: str | None = None


def new_token() -> str:
    """A fresh random API token (shown once, never stored in plain text)."""
    return "et_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer ...`` header, or raise 401."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    token = authorization[7:].strip()
    if not token:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return token


def authenticate(tokens: TokenStore, authorization: str | None) -> Principal:
    """Resolve an ``Authorization: Bearer ...`` header to a principal, or raise 401."""
    record = tokens.find_token(hash_token(bearer(authorization)))
    if record is None:
        raise Unauthorized("unknown or revoked API token")
    return _principal(record)


def verified(tokens: TokenStore, authorization: str | None) -> Principal | None:
    """The principal of a header whose token was verified moments ago, without I/O; None
    when it must be looked up (:func:`authenticate`). 401 for a header with no token."""
    record = tokens.verified_token(hash_token(bearer(authorization)))
    return None if record is None else _principal(record)


def _principal(record: TokenRecord) -> Principal:
    return Principal(tenant_id=record.tenant_id, role=record.role, job_id=record.job_id)


def require_user(principal: Principal) -> Principal:
    """Reject job-scoped reporter tokens on user routes."""
    if principal.role == "reporter":
        raise Forbidden("a job telemetry token cannot call this route")
    return principal


def _write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to a new file only its owner can read (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def ensure_admin_token(
    tokens: TokenStore, *, configured: str | None, data_dir: Path
) -> Path | None:
    """Make sure the admin token is live; return the file it was written to, if any.

    ``ETRAIN_ADMIN_TOKEN`` wins and replaces the admin token of earlier starts
    (which is revoked, and its generated file removed). Otherwise a token is
    generated once, written to ``<data_dir>/admin_token`` (mode 0600) and reused on
    later starts.
    """
    tenant = tokens.ensure_tenant(ADMIN_TENANT)
    path = data_dir / TOKEN_FILE
    if configured:
        token = configured
        path.unlink(missing_ok=True)  # it would hold a revoked token
        path = None
    else:
        token = path.read_text().strip() if path.is_file() else ""
        if not token:  # absent, or left empty by an interrupted first start
            token = new_token()
            _write_secret(path, token)
    tokens.set_bootstrap_admin(tenant_id=tenant.id, token_hash=hash_token(token), name="admin")
    _revoke_reserved_user_tokens(tokens, tenant.id)
    return path


def _revoke_reserved_user_tokens(tokens: TokenStore, tenant_id: str) -> None:
    """Revoke the user tokens of the admin tenant: a database from before its name was
    reserved may hold some, and each could list and revoke the admin token."""
    for token, _ in tokens.list_tokens(tenant_id=tenant_id):
        if token.role == "user" and tokens.revoke_token(token.id) is not None:
            log.warning(
                "revoked user token %s (%r) of the reserved tenant %r; create the user a "
                "token for another tenant",
                token.id,
                token.name,
                ADMIN_TENANT,
            )


def issue_user_token(tokens: TokenStore, *, tenant: str, name: str) -> tuple[str, TokenRecord]:
    """Create (if needed) ``tenant`` and a user token for it; return the token (once) and
    its stored record. A reserved tenant name (``RESERVED_TENANTS``) is a ValueError."""
    if tenant in RESERVED_TENANTS:
        raise ValueError(f"tenant {tenant!r} is reserved for the service")
    record = tokens.ensure_tenant(tenant)
    token = new_token()
    stored = tokens.add_token(
        tenant_id=record.id, token_hash=hash_token(token), name=name, role="user"
    )
    return token, stored


def create_user_token(tokens: TokenStore, *, tenant: str, name: str) -> str:
    """Create (if needed) ``tenant`` and a user token for it; return the token once."""
    return issue_user_token(tokens, tenant=tenant, name=name)[0]


def create_reporter_token(tokens: TokenStore, *, tenant_id: str, job_id: str) -> str:
    """A token that may only post telemetry for one job (handed to its Ray job)."""
    token = new_token()
    tokens.add_token(
        tenant_id=tenant_id,
        token_hash=hash_token(token),
        name=f"reporter:{job_id}",
        role="reporter",
        job_id=job_id,
    )
    return token
