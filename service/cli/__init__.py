"""The ``etrain`` command-line client: submit, follow and inspect training jobs over REST.

Only httpx, typer, rich and yaml are imported at start-up so that ``etrain
--help`` stays fast; ``etrain serve`` imports the server (and with it Ray) and
``etrain export`` the exporter and ``etrain generate`` the generator (and with them
torch) only when they run.

This module is the CLI's composition root: it holds the process-wide knobs
(consoles, the HTTP transport, the pause between polls), turns them into each
invocation's :class:`~service.cli.common.Session`, and registers the commands
of :mod:`.jobs`, :mod:`.plan`, :mod:`.export`, :mod:`.generate`, :mod:`.data`, :mod:`.manifests`,
:mod:`.tokens`, :mod:`.node` and :mod:`.report`.
"""

from __future__ import annotations

import time
from typing import Annotated

import httpx
import typer
from rich.console import Console

import service.cli.report_compare as report_compare
from service.cli import data, export, generate, jobs, manifests, node, plan, report, tokens
from service.cli.common import EXIT_API_ERROR, EXIT_INTERRUPTED, Session
from service.client import DEFAULT_URL

__all__ = ["EXIT_API_ERROR", "EXIT_INTERRUPTED", "app"]

app = typer.Typer(help="etrain: elastic training jobs on Ray.", no_args_is_help=True)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
POLL_INTERVAL_S = 1.0


def _transport() -> httpx.BaseTransport | None:
    """The transport the client uses: None = the real network (tests replace this hook)."""
    return None


def _pause() -> None:
    """Wait between two polls of a followed job."""
    time.sleep(POLL_INTERVAL_S)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(envvar="ETRAIN_URL", help="Service URL.")] = DEFAULT_URL,
    token: Annotated[
        str | None, typer.Option(envvar="ETRAIN_TOKEN", help="API token.", show_default=False)
    ] = None,
) -> None:
    """Talk to an etrain service (ETRAIN_URL, ETRAIN_TOKEN)."""
    # Module globals are read here, per invocation, so a test that replaces them is heard.
    ctx.obj = Session(
        url=url,
        token=token,
        transport=_transport,
        console=console,
        err_console=err_console,
        pause=_pause,
    )


manifests.register(app)
jobs.register(app)
plan.register(app)
export.register(app)
generate.register(app)
data.register(app)
tokens.register(app)
node.register(app)
report.register(app)
report_compare.register(report.report_app)

if __name__ == "__main__":
    app()
