"""``etrain plan``: a dry run of a spec on the connected cluster or a described one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from service.cli.common import GIB, Session, SpecArg, client, fmt, session

_MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "total")


def _gib(n: Any) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB" if isinstance(n, int | float) else "-"


def _human_count(n: Any) -> str:
    """A parameter count as 1.23M / 4.56B."""
    if not isinstance(n, int | float):
        return "-"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _yes_no(value: bool | None, *, no: str = "no") -> str:
    """yes / no / unknown for a fit that may be unknown (null)."""
    return "unknown" if value is None else ("yes" if value else no)


def _memory_table(plan: dict[str, Any]) -> Table:
    """Memory per rank by kind, then the buffers and host memory behind it."""
    per_rank = plan.get("per_rank") or {}
    table = Table("memory per rank", "GiB", "bytes")
    for part in _MEMORY_PARTS:
        value = per_rank.get(f"{part}_bytes")
        table.add_row(part, _gib(value), fmt(value, ",d"))
    breakdown = plan.get("breakdown") or {}
    for name, value in (breakdown.get("buffers") or {}).items():
        table.add_row(f"  buffer: {name}", _gib(value), fmt(value, ",d"))
    for name, value in (breakdown.get("host") or {}).items():
        table.add_row(f"host: {name}", _gib(value), fmt(value, ",d"))
    return table


def _print_plan(s: Session, plan: dict[str, Any]) -> None:
    """Render a plan: fit, parameter count, memory per rank, layout, estimates, findings."""
    console = s.console
    fits = plan.get("fits")
    console.print(f"fits: {_yes_no(fits, no='NO')}", markup=False)
    if fits is None and plan.get("unknown_reason"):
        console.print(f"  {plan['unknown_reason']}", markup=False)
    count = plan.get("num_params")
    console.print(f"parameters: {_human_count(count)} ({count})", markup=False)
    console.print(_memory_table(plan))
    layout = plan.get("layout")
    if isinstance(layout, dict):
        layout = "  ".join(f"{k}={v}" for k, v in layout.items())
    console.print(f"layout: {layout if layout is not None else '-'}", markup=False)
    _print_estimates(s, plan)
    _print_placement(s, plan.get("placement"))
    for key in ("warnings", "errors", "notes"):
        for line in plan.get(key) or []:
            console.print(f"{key.rstrip('s')}: {line}", markup=False)
    if plan.get("recommendation"):
        console.print(f"recommendation: {plan['recommendation']}", markup=False)
    rec = plan.get("recommended_layout")
    if isinstance(rec, dict):
        console.print(f"  {rec.get('layout')}: {rec.get('reason')}", markup=False)


def _print_estimates(s: Session, plan: dict[str, Any]) -> None:
    """The job's estimated step and the best candidate layouts, when a GPU model is known."""
    step = plan.get("step_estimate")
    if isinstance(step, dict):
        s.console.print(
            f"estimated step: {step['step_s']:.3g} s, {step['comm_share']:.0%} communicating",
            markup=False,
        )
    cands = [c for c in plan.get("candidates") or [] if isinstance(c, dict)]
    if not cands or not any("step_s" in c for c in cands):
        return
    table = Table("layout", "GiB/rank", "fits", "step s", "comm")
    for c in cands[:8]:
        table.add_row(
            str(c.get("layout")),
            fmt(c.get("total_gib")),
            _yes_no(c.get("fits")),
            fmt(c.get("step_s")),
            f"{c['comm_share']:.0%}" if "comm_share" in c else "-",
        )
    s.console.print(table)


def _print_placement(s: Session, placement: Any) -> None:
    """Where each rank goes on a cluster described node by node, and what bounds it."""
    if not isinstance(placement, dict):
        return
    needs = placement.get("rank_bytes") or []
    table = Table("node", "GPUs", "GiB each", "ranks", "GiB per rank")
    for node in placement.get("nodes") or []:
        ranks = node.get("ranks") or []
        table.add_row(
            str(node.get("node")),
            fmt(node.get("gpus")),
            _gib(node.get("gpu_memory_bytes")).removesuffix(" GiB"),
            ", ".join(map(str, ranks)) or ("-" if node.get("holds_a_rank") else "none fits"),
            ", ".join(_gib(needs[r]).removesuffix(" GiB") for r in ranks if r < len(needs)),
        )
    s.console.print(table)
    s.console.print(f"placement: {placement.get('summary')}", markup=False)


def _cluster_options(base: dict[str, Any] | None, **given: Any) -> dict[str, Any] | None:
    """The cluster file's mapping with the command-line options laid over it."""
    given = {
        k: (v[0] if isinstance(v, list) and len(v) == 1 else v)
        for k, v in given.items()
        if v not in (None, [])
    }
    if base is None and not given:
        return None
    return {**(base or {}), **given}


def plan(
    ctx: typer.Context,
    spec: SpecArg,
    cluster: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Cluster description (YAML); default: the connected cluster.",
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node.")] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option(
            help="GPU model (h100, h200, a100, l40s, rtx4090, rtx3060, ...); repeat for a mix."
        ),
    ] = None,
    gpu_memory_gb: Annotated[
        list[float] | None,
        typer.Option(
            help="GPU memory in GiB (overrides the model's); repeat for GPUs of different sizes."
        ),
    ] = None,
    interconnect: Annotated[
        str | None, typer.Option(help="Link inside a node: nvlink3/4/5, pcie3/4/5.")
    ] = None,
    network: Annotated[
        str | None, typer.Option(help="Link between nodes: ib-hdr, ib-ndr, ethernet-100g, ...")
    ] = None,
    host_memory_gb: Annotated[
        float | None, typer.Option(help="Host memory per node in GiB.")
    ] = None,
) -> None:
    """Dry-run a spec: memory per rank, parallel layout, warnings. Exits 1 if it does not fit
    (not when it cannot tell: a GPU job without known GPU memory says so and exits 0).

    The cluster is the connected one unless --cluster or the options describe
    another (options override the file).
    """
    s = session(ctx)
    body = s.load_file(spec)
    cluster_body = _cluster_options(
        s.load_file(cluster) if cluster is not None else None,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        gpu_memory_gb=gpu_memory_gb,
        interconnect=interconnect,
        network=network,
        host_memory_gb=host_memory_gb,
    )
    with s.api_errors():
        result = client(ctx).plan(body, cluster_body)
    _print_plan(s, result)
    if result.get("fits") is False or result.get("errors"):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``plan`` to ``app``."""
    app.command()(plan)
