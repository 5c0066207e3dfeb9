"""``etrain node join``: this machine becomes a Ray worker node of an etrain cluster;
``etrain node certs``: the TLS files of a node, for networks without an encrypted overlay.

Run on the machine to add (a home PC, a cloud VM), with the address ``etrain serve``
printed and a copy of the cluster's Ray token. The node runs in the foreground until it
is stopped (Ctrl-C) or loses the head; jobs grow onto it and shrink off it (docs/nodes.md).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated

import typer

node_app = typer.Typer(
    help="Ray nodes: join this machine to a cluster; make their TLS files.", no_args_is_help=True
)
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}")
MAX_TOKEN_BYTES = 4096


def _token_env(token_file: Path | None) -> dict[str, str]:
    """Ray's token settings for the node: the file given, else this environment's."""
    if token_file is None:
        if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
            return {"RAY_AUTH_MODE": "token"}
        raise typer.BadParameter(
            "give the cluster's Ray token: a copy of the head's ray_auth_token file "
            "(etrain serve names it), or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH",
            param_hint="--token-file",
        )
    path = token_file.expanduser().resolve()
    if not path.is_file() or not 0 < path.stat().st_size <= MAX_TOKEN_BYTES:
        raise typer.BadParameter(
            f"{token_file} is not a token file (a regular file of 1 to {MAX_TOKEN_BYTES} bytes)",
            param_hint="--token-file",
        )
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def _resources(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and all(
            isinstance(v, int | float) and v >= 0 for v in parsed.values()
        ):
            return parsed
    except ValueError:
        pass
    raise typer.BadParameter(
        'a JSON object of resource names to amounts, e.g. {"accelerator_type:A10G": 1}',
        param_hint="--resources",
    )


@node_app.command("join")
def join(
    head: Annotated[
        str, typer.Option(help="The head's GCS address HOST:PORT, as `etrain serve` prints it.")
    ],
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="A copy of the cluster's Ray token file (the head's ray_auth_token); "
            "default: RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH."
        ),
    ] = None,
    num_cpus: Annotated[int | None, typer.Option(min=0, help="CPUs; default: all.")] = None,
    num_gpus: Annotated[int | None, typer.Option(min=0, help="GPUs; default: all.")] = None,
    gpu_memory_gb: Annotated[
        float | None,
        typer.Option(min=0, help="Memory of each GPU, for the planner (mixed GPU sizes)."),
    ] = None,
    resources: Annotated[
        str | None, typer.Option(help="More Ray resources, as a JSON object.")
    ] = None,
    node_ip: Annotated[
        str | None,
        typer.Option(help="This node's address the others reach (e.g. its overlay address)."),
    ] = None,
    temp_dir: Annotated[Path | None, typer.Option(help="Ray's session folder.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the command; start nothing.")] = False,
) -> None:
    """Start a Ray worker node here that joins the cluster at HEAD with its token, on the
    documented join ports (docs/nodes.md), until stopped."""
    from service.backends.node_join import ray_start_args
    from service.ray_head import head_env

    if not _HOST_PORT.fullmatch(head):
        raise typer.BadParameter(f"{head!r} is not HOST:PORT", param_hint="--head")
    auth = _token_env(token_file)
    args = ray_start_args(
        head,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        gpu_memory_gb=gpu_memory_gb,
        resources=_resources(resources),
        node_ip=node_ip,
        temp_dir=temp_dir,
    )
    if dry_run:
        typer.echo(" ".join(args))
        return
    # The node's processes (and so the jobs' workers here) get the head's allow-list only,
    # and the token given (Ray reads RAY_AUTH_TOKEN before RAY_AUTH_TOKEN_PATH).
    env = head_env(os.environ)
    if "RAY_AUTH_TOKEN_PATH" in auth:
        env.pop("RAY_AUTH_TOKEN", None)
    os.execve(args[0], args, {**env, **auth})


@node_app.command("certs")
def certs(
    out: Annotated[Path, typer.Option(help="Where this node's files go (copy it to the node).")],
    address: Annotated[
        list[str],
        typer.Option(help="An address other nodes reach this one at (IP or name); repeat."),
    ],
    ca: Annotated[
        Path,
        typer.Option(
            help="The cluster's CA folder (ca.crt, ca.key), made if empty; keep it off the nodes."
        ),
    ] = Path("etrain-ray-ca"),
    days: Annotated[int, typer.Option(min=1, max=3650, help="Days the certificates hold.")] = 365,
) -> None:
    """Make a key and certificate for one node's Ray TLS, signed by the cluster's CA, and
    print the variables that turn Ray's TLS on (docs/nodes.md). No key is printed."""
    from service.backends.node_tls import issue_node_certs

    try:
        made = issue_node_certs(out, ca, address, days=days)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--address") from e
    if made.created_ca:
        typer.echo(f"made the cluster's CA in {ca} (its ca.key signs node certificates)")
    typer.echo(f"this node's key and certificate are in {out}; on it, before etrain serve or")
    typer.echo("etrain node join (with the paths where the folder is on that node):")
    for name, value in made.env().items():
        typer.echo(f"export {name}={value}")


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
