"""``etrain token create|list|revoke``: API tokens of tenants.

An admin creates and revokes any tenant's tokens; a user token lists and
revokes its own tenant's. A token's secret is printed once, by ``create``.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from service.cli.common import client, session

token_app = typer.Typer(help="API tokens: create (admin), list, revoke.", no_args_is_help=True)


@token_app.command("create")
def create(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Argument(help="Tenant name (created if new).")],
    name: Annotated[str, typer.Option(help="A label for the token.")] = "token",
) -> None:
    """Create a user token for TENANT (admin only); prints the token once."""
    s = session(ctx)
    with s.api_errors():
        created = client(ctx).create_token(tenant, name)
    s.err_console.print(f"token {created['id']} for tenant {created['tenant']}:", markup=False)
    s.console.print(created["token"], markup=False)


@token_app.command("list")
def list_tokens(ctx: typer.Context) -> None:
    """List live tokens (never their secrets): all tenants' for an admin."""
    s = session(ctx)
    with s.api_errors():
        tokens = client(ctx).list_tokens()
    table = Table("ID", "TENANT", "NAME", "ROLE", "CREATED")
    for t in tokens:
        table.add_row(t["id"], t["tenant"], t["name"], t["role"], str(t["created_at"])[:19])
    s.console.print(table)


@token_app.command("revoke")
def revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(help="Token id (etrain token list).")],
) -> None:
    """Revoke a token at once; requests with it get 401 from then on."""
    s = session(ctx)
    with s.api_errors():
        revoked = client(ctx).revoke_token(token_id)
    s.console.print(
        f"revoked {revoked['id']} ({revoked['tenant']}/{revoked['name']})", markup=False
    )


def register(app: typer.Typer) -> None:
    """Add ``etrain token`` to ``app``."""
    app.add_typer(token_app, name="token")
