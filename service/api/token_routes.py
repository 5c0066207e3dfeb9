"""REST routes of API tokens: create (admin), list and revoke.

An admin creates tokens for any tenant, lists every tenant's and revokes any. A
user lists its own tenant's tokens and may revoke them (a leaked token can be
revoked by the team it belongs to); another tenant's token is a 404. A token's
secret is shown once, when it is created; only its hash is stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from service.api import openapi
from service.api.deps import User, runtime
from service.api.parsing import read_body
from service.api.schemas import TokenInfo, TokenPage, TokenPublic, TokenRequest
from service.auth import Principal, issue_user_token
from service.domain.validation import field_errors
from service.errors import Forbidden, InvalidSpec, JobNotFound

if TYPE_CHECKING:
    from service.store import TokenRecord

v1 = APIRouter(prefix="/v1")
# The body create_token decodes itself, after authentication; app.create_app documents it.
BODY_MODELS = (TokenRequest,)


class TokenNotFound(JobNotFound):
    """No live token with this id is visible to the caller (a 404, like a job's)."""


def _info(token: TokenRecord, tenant: str) -> TokenInfo:
    return TokenInfo(
        id=token.id, tenant=tenant, name=token.name, role=token.role, created_at=token.created_at
    )


def _scope(user: Principal) -> str | None:
    """The tenant whose tokens ``user`` may see: all (None) for an admin."""
    return None if user.role == "admin" else user.tenant_id


@v1.post(
    "/tokens",
    status_code=201,
    openapi_extra=openapi.body(openapi.ref(TokenRequest), yaml=False),
)
async def create_token(request: Request, user: User) -> TokenPublic:
    """Admin only: create a tenant's API token. The token is shown only in this answer."""
    if user.role != "admin":
        raise Forbidden("only an admin token can create tokens")
    data = await read_body(request, yaml_ok=False)
    try:
        body = TokenRequest.model_validate(data)
    except ValidationError as e:
        errors = field_errors(e, ["body"], root=TokenRequest)
        raise InvalidSpec("invalid token request", errors) from e
    token, record = await run_in_threadpool(  # the store: off the event loop
        issue_user_token, runtime(request).stores.tokens, tenant=body.tenant, name=body.name
    )
    return TokenPublic(id=record.id, tenant=body.tenant, name=body.name, token=token)


@v1.get("/tokens")
def read_tokens(request: Request, user: User) -> TokenPage:
    """Live user and admin tokens (never their secrets): every tenant's for an admin, the
    caller's tenant's for a user."""
    listed = runtime(request).stores.tokens.list_tokens(tenant_id=_scope(user))
    return TokenPage(items=[_info(token, tenant) for token, tenant in listed])


@v1.delete("/tokens/{token_id}")
def delete_token(token_id: str, request: Request, user: User) -> TokenInfo:
    """Revoke a token at once; answers the token revoked. An admin may revoke any, a user
    its own tenant's."""
    revoked = runtime(request).stores.tokens.revoke_token(token_id, tenant_id=_scope(user))
    if revoked is None:
        raise TokenNotFound(f"no live token {token_id!r}; list them with GET /v1/tokens")
    return _info(*revoked)
