"""API tokens as the routes see them: who a bearer header is, and creating, listing and
revoking tenants' tokens.

An admin creates tokens for any tenant, lists every tenant's and revokes any. A user
lists its own tenant's tokens and may revoke them (a leaked token can be revoked by the
team it belongs to); another tenant's token is a 404. A token's secret is returned once,
when it is created; only its hash is stored.
"""

from __future__ import annotations

from service.auth import Principal, authenticate, issue_user_token, verified
from service.errors import Forbidden, JobNotFound
from service.store import TokenRecord, TokenStore


class TokenNotFound(JobNotFound):
    """No live token with this id is visible to the caller (a 404, like a job's)."""


def _scope(user: Principal) -> str | None:
    """The tenant whose tokens ``user`` may see: all (None) for an admin."""
    return None if user.role == "admin" else user.tenant_id


class Tokens:
    """Authentication and the token lifecycle over the token store."""

    def __init__(self, store: TokenStore):
        """Read and write tokens in ``store``."""
        self.store = store

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer ...`` header (401 otherwise)."""
        return authenticate(self.store, authorization)

    def verified(self, authorization: str | None) -> Principal | None:
        """The principal of a header verified moments ago, without I/O (None: ask
        :meth:`authenticate`)."""
        return verified(self.store, authorization)

    def check_may_create(self, user: Principal) -> None:
        """403 unless ``user`` may create tokens (an admin), before its body is read."""
        if user.role != "admin":
            raise Forbidden("only an admin token can create tokens")

    def create(self, user: Principal, *, tenant: str, name: str) -> tuple[str, TokenRecord]:
        """A new user token of ``tenant`` (created if new): its secret, once, and its record."""
        self.check_may_create(user)
        return issue_user_token(self.store, tenant=tenant, name=name)

    def list(self, user: Principal) -> list[tuple[TokenRecord, str]]:
        """Live user and admin tokens with their tenant's name: every tenant's for an
        admin, the caller's tenant's for a user."""
        return self.store.list_tokens(tenant_id=_scope(user))

    def revoke(self, user: Principal, token_id: str) -> tuple[TokenRecord, str]:
        """Revoke a live token ``user`` may see; it and its tenant's name (404 otherwise)."""
        revoked = self.store.revoke_token(token_id, tenant_id=_scope(user))
        if revoked is None:
            raise TokenNotFound(f"no live token {token_id!r}; list them with GET /v1/tokens")
        return revoked
