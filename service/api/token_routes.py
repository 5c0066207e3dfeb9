"""REST routes of API tokens: create (admin), list and revoke (``service.domain.tokens``
says who may do what). A token's secret is shown once, when it is created."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from service.api import openapi
from service.api.deps import TokenService, User
from service.api.parsing import read_body
from service.api.schemas import TokenInfo, TokenPage, TokenPublic, TokenRequest
from service.domain.validation import field_errors
from service.errors import InvalidSpec

if TYPE_CHECKING:
    from service.store import TokenRecord

v1 = APIRouter(prefix="/v1")
# The body create_token decodes itself, after authentication; app.create_app documents it.
BODY_MODELS = (TokenRequest,)


def _info(token: TokenRecord, tenant: str) -> TokenInfo:
    return TokenInfo(
        id=token.id, tenant=tenant, name=token.name, role=token.role, created_at=token.created_at
    )


@v1.post(
    "/tokens",
    status_code=201,
    openapi_extra=openapi.body(openapi.ref(TokenRequest), yaml=False),
)
async def create_token(request: Request, user: User, tokens: TokenService) -> TokenPublic:
    """Admin only: create a tenant's API token. The token is shown only in this answer."""
    tokens.check_may_create(user)  # before the body is read
    data = await read_body(request, yaml_ok=False)
    try:
        body = TokenRequest.model_validate(data)
    except ValidationError as e:
        errors = field_errors(e, ["body"], root=TokenRequest)
        raise InvalidSpec("invalid token request", errors) from e
    token, record = await run_in_threadpool(  # the store: off the event loop
        tokens.create, user, tenant=body.tenant, name=body.name
    )
    return TokenPublic(id=record.id, tenant=body.tenant, name=body.name, token=token)


@v1.get("/tokens")
def read_tokens(user: User, tokens: TokenService) -> TokenPage:
    """Live user and admin tokens (never their secrets): every tenant's for an admin, the
    caller's tenant's for a user."""
    return TokenPage(items=[_info(token, tenant) for token, tenant in tokens.list(user)])


@v1.delete("/tokens/{token_id}")
def delete_token(token_id: str, user: User, tokens: TokenService) -> TokenInfo:
    """Revoke a token at once; answers the token revoked. An admin may revoke any, a user
    its own tenant's."""
    return _info(*tokens.revoke(user, token_id))
