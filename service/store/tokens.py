"""Tenants and their API tokens (tokens are stored only as hashes)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from service.store.database import Database
from service.store.models import TenantRecord, TokenRecord, new_id, utcnow
from service.store.tables import TENANTS, TOKENS

ROLES = frozenset({"admin", "user", "reporter"})
# A live token read from the database is taken as live for this long without reading it
# again (the lookup was the largest part of a small request). A revocation through this
# store forgets every such token at once; one made by another replica holds within this.
VERIFIED_FOR_S = 2.0
_VERIFIED_MAX = 10_000  # tokens remembered at most (forgotten all at once past it)
_TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenRecord))


def _record(row: Any) -> TokenRecord:
    """The token of a row that may carry more columns (a join)."""
    return TokenRecord(**{name: row._mapping[name] for name in _TOKEN_FIELDS})


class TokenStore:
    """The ``tenants`` and ``api_tokens`` tables. Every call is its own transaction."""

    def __init__(self, db: Database):
        """Use the tables of ``db``."""
        self._db = db
        self._verified: dict[str, tuple[TokenRecord, float]] = {}  # hash -> (token, until)

    def _forget_verified(self) -> None:
        """Read every token from the database again (after a revocation)."""
        self._verified = {}

    def create_tenant(self, name: str) -> TenantRecord:
        """Create a tenant; a duplicate name raises sqlalchemy's IntegrityError."""
        record = TenantRecord(id=new_id("t-"), name=name, created_at=utcnow())
        with self._db.begin() as conn:
            conn.execute(insert(TENANTS).values(dataclasses.asdict(record)))
        return record

    def ensure_tenant(self, name: str) -> TenantRecord:
        """The tenant called ``name``, created if there is none; safe when callers race.

        The insert does nothing on a duplicate name (the unique constraint decides
        which racing caller created it) and the row is read back in the same
        transaction.
        """
        record = TenantRecord(id=new_id("t-"), name=name, created_at=utcnow())
        query = self._db.insert(TENANTS).values(dataclasses.asdict(record))
        with self._db.begin() as conn:
            conn.execute(query.on_conflict_do_nothing(index_elements=["name"]))
            row = conn.execute(select(TENANTS).where(TENANTS.c.name == name)).one()
        return TenantRecord(**row._mapping)

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

    def verified_token(self, token_hash: str) -> TokenRecord | None:
        """The live token with this hash if it was read in the last ``VERIFIED_FOR_S``,
        else None (no I/O: ask :meth:`find_token`)."""
        known = self._verified.get(token_hash)
        return known[0] if known is not None and known[1] > time.monotonic() else None

    def find_token(self, token_hash: str) -> TokenRecord | None:
        """Return the unrevoked token with this hash, or None (``VERIFIED_FOR_S``)."""
        known = self.verified_token(token_hash)
        if known is not None:
            return known
        query = select(TOKENS).where(
            TOKENS.c.token_hash == token_hash, TOKENS.c.revoked_at.is_(None)
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None  # unknown tokens are not remembered: a guesser cannot fill this
        record = TokenRecord(**row._mapping)
        if len(self._verified) >= _VERIFIED_MAX:
            self._forget_verified()
        self._verified[token_hash] = (record, time.monotonic() + VERIFIED_FOR_S)
        return record

    def revoke_job_tokens(self, job_id: str) -> int:
        """Revoke the reporter tokens scoped to ``job_id``; return how many."""
        stmt = (
            update(TOKENS)
            .where(TOKENS.c.job_id == job_id, TOKENS.c.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
        with self._db.begin() as conn:
            revoked = conn.execute(stmt).rowcount
        self._forget_verified()
        return revoked

    def list_tokens(self, *, tenant_id: str | None = None) -> list[tuple[TokenRecord, str]]:
        """Unrevoked user and admin tokens with their tenant's name, oldest first.

        Reporter tokens (one per job, revoked when it ends) are not listed.
        """
        query = (
            select(TOKENS, TENANTS.c.name.label("tenant_name"))
            .join(TENANTS, TENANTS.c.id == TOKENS.c.tenant_id)
            .where(TOKENS.c.revoked_at.is_(None), TOKENS.c.role != "reporter")
            .order_by(TOKENS.c.created_at, TOKENS.c.id)
        )
        if tenant_id is not None:
            query = query.where(TOKENS.c.tenant_id == tenant_id)
        with self._db.connect() as conn:
            rows = conn.execute(query).all()
        fields = [f.name for f in dataclasses.fields(TokenRecord)]
        return [
            (TokenRecord(**{f: row._mapping[f] for f in fields}), row.tenant_name) for row in rows
        ]

    def revoke_token(
        self, token_id: str, *, tenant_id: str | None = None
    ) -> tuple[TokenRecord, str] | None:
        """Revoke one live token by id (only ``tenant_id``'s, when given); return it with its
        tenant's name, or None when there is no such live token."""
        stmt = update(TOKENS).where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None))
        if tenant_id is not None:
            stmt = stmt.where(TOKENS.c.tenant_id == tenant_id)
        query = (
            select(TOKENS, TENANTS.c.name.label("tenant_name"))
            .join(TENANTS, TENANTS.c.id == TOKENS.c.tenant_id)
            .where(TOKENS.c.id == token_id)
        )
        with self._db.begin() as conn:
            if conn.execute(stmt.values(revoked_at=utcnow())).rowcount != 1:
                return None
            row = conn.execute(query).one()
        self._forget_verified()
        return _record(row), row.tenant_name

    def set_bootstrap_admin(self, *, tenant_id: str, token_hash: str, name: str) -> None:
        """Make ``token_hash`` the one live admin token called ``name`` of ``tenant_id``.

        Every other admin-role token of that name and tenant is revoked, so a new
        configured admin token replaces the old one rather than adding to it. A
        hash stored before (and maybe revoked) is made live again.
        """
        revoke = update(TOKENS).where(
            TOKENS.c.tenant_id == tenant_id,
            TOKENS.c.role == "admin",
            TOKENS.c.name == name,
            TOKENS.c.token_hash != token_hash,
            TOKENS.c.revoked_at.is_(None),
        )
        live = update(TOKENS).where(TOKENS.c.token_hash == token_hash, TOKENS.c.role == "admin")
        try:
            for _ in range(2):  # a second pass when another process inserted it first
                with self._db.begin() as conn:
                    conn.execute(revoke.values(revoked_at=utcnow()))
                    if conn.execute(live.values(revoked_at=None)).rowcount == 1:
                        return
                try:
                    self.add_token(
                        tenant_id=tenant_id, token_hash=token_hash, name=name, role="admin"
                    )
                    return
                except IntegrityError:
                    continue
        finally:
            self._forget_verified()
        raise ValueError("the admin token must differ from every other API token")
