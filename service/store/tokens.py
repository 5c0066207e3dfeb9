"""Tenants and their API tokens (tokens are stored only as hashes)."""

from __future__ import annotations

import dataclasses

from sqlalchemy import insert, select, update

from service.store.database import Database
from service.store.models import TenantRecord, TokenRecord, new_id, utcnow
from service.store.tables import TENANTS, TOKENS

ROLES = frozenset({"admin", "user", "reporter"})


class TokenStore:
    """The ``tenants`` and ``api_tokens`` tables. Every call is its own transaction."""

    def __init__(self, db: Database):
        """Use the tables of ``db``."""
        self._db = db

    def create_tenant(self, name: str) -> TenantRecord:
        """Create a tenant; a duplicate name raises sqlalchemy's IntegrityError."""
        record = TenantRecord(id=new_id("t-"), name=name, created_at=utcnow())
        with self._db.begin() as conn:
            conn.execute(insert(TENANTS).values(dataclasses.asdict(record)))
        return record

    def get_tenant_by_name(self, name: str) -> TenantRecord | None:
        """Return the tenant called ``name``, or None."""
        with self._db.connect() as conn:
            row = conn.execute(select(TENANTS).where(TENANTS.c.name == name)).first()
        return None if row is None else TenantRecord(**row._mapping)

    def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        """Return the tenant with id ``tenant_id``, or None."""
        with self._db.connect() as conn:
            row = conn.execute(select(TENANTS).where(TENANTS.c.id == tenant_id)).first()
        return None if row is None else TenantRecord(**row._mapping)

    def add_token(
        self, *, tenant_id: str, token_hash: str, name: str, role: str, job_id: str | None = None
    ) -> TokenRecord:
        """Store a token by its sha256 hex ``token_hash``; reporter tokens need a ``job_id``."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {sorted(ROLES)}, not {role!r}")
        if (role == "reporter") != (job_id is not None):
            raise ValueError("set job_id for a reporter token, and only for one")
        record = TokenRecord(
            id=new_id("k-"),
            tenant_id=tenant_id,
            token_hash=token_hash,
            name=name,
            role=role,
            job_id=job_id,
            created_at=utcnow(),
            revoked_at=None,
        )
        with self._db.begin() as conn:
            conn.execute(insert(TOKENS).values(dataclasses.asdict(record)))
        return record

    def find_token(self, token_hash: str) -> TokenRecord | None:
        """Return the unrevoked token with this hash, or None."""
        query = select(TOKENS).where(
            TOKENS.c.token_hash == token_hash, TOKENS.c.revoked_at.is_(None)
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else TokenRecord(**row._mapping)

    def revoke_job_tokens(self, job_id: str) -> int:
        """Revoke the reporter tokens scoped to ``job_id``; return how many."""
        stmt = (
            update(TOKENS)
            .where(TOKENS.c.job_id == job_id, TOKENS.c.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
        with self._db.begin() as conn:
            return conn.execute(stmt).rowcount
