"""The `etrain` command-line client: submit, follow and inspect training jobs over REST.

Only httpx, typer, rich and yaml are imported at module level so that
``etrain --help`` stays fast; ``etrain serve`` imports the server (and with it
Ray) lazily.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table

from service.client import DEFAULT_URL, ClientError, EtrainClient
from service.export import ExportDtype, ExportFormat, ExportNaming, ExportRefused, export_job
from service.k8s.cli import manifests_app

app = typer.Typer(help="etrain: elastic training jobs on Ray.", no_args_is_help=True)
app.add_typer(manifests_app, name="manifests")
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
POLL_INTERVAL_S = 1.0
EXIT_API_ERROR = 2
EXIT_INTERRUPTED = 130
GIB = 1024**3

def _transport() -> httpx.BaseTransport | None:
    """The transport the client uses: None = the real network (tests replace this hook)."""
    return None

SpecArg = Annotated[
    Path,
    typer.Argument(exists=True, dir_okay=False, readable=True, help="Job spec (.yaml/.yml/.json)."),
]
JobIdArg = Annotated[str, typer.Argument(help="Job id.")]


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str, typer.Option(envvar="ETRAIN_URL", help="Service URL.")] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option(envvar="ETRAIN_TOKEN", help="API token.", show_default=False),
    ] = None,
) -> None:
    """Talk to an etrain service (ETRAIN_URL, ETRAIN_TOKEN)."""
    ctx.obj = {"url": url, "token": token}


def _client(ctx: typer.Context) -> EtrainClient:
    """Build the API client for this invocation from the callback's options."""
    ctx.obj = ctx.obj or {"url": DEFAULT_URL, "token": None}
    client = EtrainClient(ctx.obj["url"], ctx.obj["token"], transport=_transport())
    ctx.call_on_close(client.close)
    return client


def _fail(message: str, code: int = EXIT_API_ERROR) -> typer.Exit:
    """Print ``message`` on stderr and return the Exit to raise."""
    err_console.print(f"error: {message}", markup=False)
    return typer.Exit(code)


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """Turn a ClientError into a clean stderr message and exit code 2 (no traceback)."""
    try:
        yield
    except ClientError as e:
        raise _fail(e.message) from None


def _load_file(path: Path) -> Any:
    """Parse a YAML or JSON file (by extension) into Python data."""
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise _fail(f"cannot read {path}: {e}") from None


def _content_type(path: Path) -> str:
    """The Content-Type a spec file is sent with."""
    return "application/json" if path.suffix.lower() == ".json" else "application/yaml"


def _hms(value: Any) -> str:
    """Format an ISO timestamp or epoch seconds as local HH:MM:SS."""
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value).strftime("%H:%M:%S")
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return (parsed.astimezone() if parsed.tzinfo else parsed).strftime("%H:%M:%S")
    except (TypeError, ValueError, OSError):
        return "--:--:--"


def _event_line(event: dict[str, Any]) -> str:
    """One event as ``HH:MM:SS kind: message``."""
    when = event.get("ts") or event.get("time") or event.get("created_at")
    return f"{_hms(when)} {event.get('kind', 'event')}: {event.get('message', '')}"


def _fmt(value: Any, spec: str | None = None) -> str:
    """A number with ``spec`` (default: 4 significant digits, grouped thousands); '-' if missing."""
    if value is None:
        return "-"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if spec is None:
        spec = ",.0f" if abs(value) >= 1000 else ".4g"
    return format(value, spec)


def _total_steps(job: dict[str, Any]) -> int | None:
    """The job's planned step count from its spec, if present."""
    return ((job.get("spec") or {}).get("train") or {}).get("steps")


def _print_final(job: dict[str, Any]) -> int:
    """Print the outcome of a finished job and return its exit code."""
    metrics = job.get("metrics") or {}
    console.print(
        f"job {job['id']} {job['status']} at step {job.get('step')}, "
        f"loss {_fmt(metrics.get('loss'))}",
        markup=False,
    )
    if job.get("error"):
        err_console.print(f"error: {job['error']}", markup=False)
    return 0 if job["status"] == "SUCCEEDED" else 1


def _progress_fields(job: dict[str, Any]) -> dict[str, Any]:
    """The columns of the follow progress bar for one job snapshot."""
    metrics = job.get("metrics") or {}
    return {
        "completed": job.get("step") or 0,
        "description": job.get("status", "?"),
        "loss": _fmt(metrics.get("loss")),
        "tps": _fmt(metrics.get("tokens_per_s"), ",.0f"),
        "ws": _fmt(job.get("world_size") or metrics.get("world_size")),
    }


def _follow(client: EtrainClient, job: dict[str, Any]) -> int:
    """Poll a job, printing new events above a progress bar, until it is terminal."""
    job_id, last_event = job["id"], None
    progress = Progress(
        TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("world {task.fields[ws]}"), TextColumn("ETA"), TimeRemainingColumn(),
        console=console,
    )
    try:
        with progress:
            fields = _progress_fields(job)
            task = progress.add_task(fields.pop("description"), total=_total_steps(job), **fields)
            while True:
                job = client.get_job(job_id)
                for event in client.get_events(job_id, after_id=last_event):
                    progress.console.print(_event_line(event), markup=False)
                    last_event = event.get("id", last_event)
                progress.update(task, total=_total_steps(job), **_progress_fields(job))
                if job.get("status") in TERMINAL:
                    break
                time.sleep(POLL_INTERVAL_S)
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; job {job_id} keeps running. Resume with "
            f"`etrain status {job_id}` or `etrain logs {job_id} -f`.",
            markup=False,
        )
        return EXIT_INTERRUPTED
    return _print_final(job)


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind (ETRAIN_HOST, default 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to bind (ETRAIN_PORT, default 8000).")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Existing Ray cluster (default: start a local one).")
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option(help="Data directory (default ~/.etrain).")
    ] = None,
) -> None:
    """Run the etrain control plane (REST API, scheduler, local Ray head unless --ray-address)."""
    # Imported here: the server pulls in FastAPI and Ray, which would slow every other command.
    from service.server import run_server

    run_server(host=host, port=port, ray_address=ray_address, data_dir=data_dir)


@app.command()
def submit(
    ctx: typer.Context,
    spec: SpecArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow progress until the job ends.")
    ] = False,
    name: Annotated[str | None, typer.Option(help="Override the spec's name.")] = None,
) -> None:
    """Submit a job spec; with --follow, show progress and events until it finishes."""
    client = _client(ctx)
    with _api_errors():
        if name is None:
            # Sent as-is so the server's errors point at the user's own file.
            job = client.submit_job(spec.read_bytes(), _content_type(spec))
        else:
            body = _load_file(spec)
            if not isinstance(body, dict):
                raise _fail(f"{spec} is not a mapping")
            job = client.submit_job({**body, "name": name})
        console.print(
            f"submitted job {job['id']} ({job.get('name')}): {job.get('status')}", markup=False
        )
        for warning in job.get("warnings") or []:
            err_console.print(f"warning: {warning}", markup=False)
        if follow:
            raise typer.Exit(_follow(client, job))


@app.command()
def jobs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many jobs.")] = None,
) -> None:
    """List jobs as a table (filter by --status, cap with --limit)."""
    with _api_errors():
        page = _client(ctx).list_jobs(status=status.upper() if status else None, limit=limit)
    table = Table("name", "status", "step", "loss", "world", "created")
    # Ids must stay copyable whole, so they get a column rich may not fold or cut.
    table.columns.insert(0, Column("id", no_wrap=True, min_width=14))
    for job in page.get("items", []):
        total = _total_steps(job)
        table.add_row(
            job["id"], job.get("name") or "", job.get("status") or "",
            f"{job.get('step') or 0}/{total if total is not None else '?'}",
            _fmt((job.get("metrics") or {}).get("loss")), _fmt(job.get("world_size")),
            str(job.get("created_at") or "")[:19].replace("T", " "),
        )
    console.print(table)
    console.print(f"{len(page.get('items', []))} of {page.get('total', '?')} jobs", markup=False)


def _print_summary(job: dict[str, Any]) -> None:
    """The human view of one job object."""
    total = _total_steps(job)
    rows = [
        ("id", job.get("id")), ("name", job.get("name")), ("status", job.get("status")),
        ("step", f"{job.get('step') or 0}/{total if total is not None else '?'}"),
        ("world size", job.get("world_size")), ("restarts", job.get("restarts")),
        ("dashboard", job.get("dashboard_url")), ("created", job.get("created_at")),
        ("started", job.get("started_at")), ("finished", job.get("finished_at")),
    ]
    metrics = job.get("metrics")
    if metrics:
        rows.append(("metrics", "  ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())))
    rows += [("warning", w) for w in job.get("warnings") or []]
    if job.get("error"):
        rows.append(("error", job["error"]))
    for key, value in rows:
        console.print(f"{key:<11}{'-' if value is None else value}", markup=False)


@app.command()
def status(
    ctx: typer.Context,
    job_id: JobIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw job JSON.")] = False,
) -> None:
    """Show one job: status, progress, latest metrics, and its last 10 events."""
    client = _client(ctx)
    with _api_errors():
        job = client.get_job(job_id)
        if as_json:
            typer.echo(json.dumps(job, indent=2))
            return
        events = client.get_events(job_id)
    _print_summary(job)
    if events:
        console.print("events:")
        for event in events[-10:]:
            console.print(f"  {_event_line(event)}", markup=False)


@app.command()
def logs(
    ctx: typer.Context,
    job_id: JobIdArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream until the job ends.")
    ] = False,
) -> None:
    """Print a job's driver and worker logs; -f streams them as they arrive."""
    client = _client(ctx)
    with _api_errors():
        if not follow:
            typer.echo(client.get_logs(job_id), nl=False)
            return
        try:
            for chunk in client.stream_logs(job_id):
                typer.echo(chunk, nl=False)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
def cancel(ctx: typer.Context, job_id: JobIdArg) -> None:
    """Cancel a job (a no-op for a job that already finished)."""
    with _api_errors():
        job = _client(ctx).cancel_job(job_id)
    console.print(f"job {job.get('id', job_id)}: {job.get('status')}", markup=False)


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


_MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "total")


def _print_plan(plan: dict[str, Any]) -> None:
    """Render a plan: fit, parameter count, memory per rank, layout, estimates, findings."""
    console.print(f"fits: {'yes' if plan.get('fits') else 'NO'}", markup=False)
    count = plan.get("num_params")
    console.print(f"parameters: {_human_count(count)} ({count})", markup=False)
    per_rank = plan.get("per_rank") or {}
    table = Table("memory per rank", "GiB", "bytes")
    for part in _MEMORY_PARTS:
        value = per_rank.get(f"{part}_bytes")
        table.add_row(part, _gib(value), _fmt(value, ",d"))
    breakdown = plan.get("breakdown") or {}
    for name, value in (breakdown.get("buffers") or {}).items():
        table.add_row(f"  buffer: {name}", _gib(value), _fmt(value, ",d"))
    for name, value in (breakdown.get("host") or {}).items():
        table.add_row(f"host: {name}", _gib(value), _fmt(value, ",d"))
    console.print(table)
    layout = plan.get("layout")
    if isinstance(layout, dict):
        layout = "  ".join(f"{k}={v}" for k, v in layout.items())
    console.print(f"layout: {layout if layout is not None else '-'}", markup=False)
    _print_estimates(plan)
    for warning in plan.get("warnings") or []:
        console.print(f"warning: {warning}", markup=False)
    for error in plan.get("errors") or []:
        console.print(f"error: {error}", markup=False)
    for note in plan.get("notes") or []:
        console.print(f"note: {note}", markup=False)
    if plan.get("recommendation"):
        console.print(f"recommendation: {plan['recommendation']}", markup=False)
    rec = plan.get("recommended_layout")
    if isinstance(rec, dict):
        console.print(f"  {rec.get('layout')}: {rec.get('reason')}", markup=False)


def _print_estimates(plan: dict[str, Any]) -> None:
    """The job's estimated step and the best candidate layouts, when a GPU model is known."""
    step = plan.get("step_estimate")
    if isinstance(step, dict):
        console.print(f"estimated step: {step['step_s']:.3g} s, {step['comm_share']:.0%} "
                      "communicating", markup=False)
    cands = [c for c in plan.get("candidates") or [] if isinstance(c, dict)]
    if not cands or not any("step_s" in c for c in cands):
        return
    table = Table("layout", "GiB/rank", "fits", "step s", "comm")
    for c in cands[:8]:
        table.add_row(str(c.get("layout")), _fmt(c.get("total_gib")),
                      "yes" if c.get("fits") else "no", _fmt(c.get("step_s")),
                      f"{c['comm_share']:.0%}" if "comm_share" in c else "-")
    console.print(table)


def _cluster_options(base: dict[str, Any] | None, **given: Any) -> dict[str, Any] | None:
    """The cluster file's mapping with the command-line options laid over it."""
    given = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in given.items()
             if v not in (None, [])}
    if base is None and not given:
        return None
    return {**(base or {}), **given}


@app.command()
def plan(
    ctx: typer.Context,
    spec: SpecArg,
    cluster: Annotated[
        Path | None,
        typer.Option(
            exists=True, dir_okay=False,
            help="Cluster description (YAML); default: the connected cluster.",
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node.")] = None,
    gpu: Annotated[list[str] | None, typer.Option(
        help="GPU model (h100, h200, a100, l40s, rtx4090, rtx3060, ...); repeat for a mix.")] = None,
    gpu_memory_gb: Annotated[list[float] | None, typer.Option(
        help="GPU memory in GiB (overrides the model's); repeat for GPUs of different sizes.")] = None,
    interconnect: Annotated[str | None, typer.Option(
        help="Link inside a node: nvlink3/4/5, pcie3/4/5.")] = None,
    network: Annotated[str | None, typer.Option(
        help="Link between nodes: ib-hdr, ib-ndr, ethernet-100g, ...")] = None,
    host_memory_gb: Annotated[float | None, typer.Option(
        help="Host memory per node in GiB.")] = None,
) -> None:
    """Dry-run a spec: memory per rank, parallel layout, warnings. Exits 1 if it does not fit.

    The cluster is the connected one unless --cluster or the options describe
    another (options override the file).
    """
    body = _load_file(spec)
    cluster_body = _cluster_options(
        _load_file(cluster) if cluster is not None else None, nodes=nodes,
        gpus_per_node=gpus_per_node, gpu=gpu, gpu_memory_gb=gpu_memory_gb,
        interconnect=interconnect, network=network, host_memory_gb=host_memory_gb)
    with _api_errors():
        result = _client(ctx).plan(body, cluster_body)
    _print_plan(result)
    if not result.get("fits") or result.get("errors"):
        raise typer.Exit(1)


@app.command("export")
def export(
    ctx: typer.Context,
    job_id: JobIdArg,
    step: Annotated[int | None, typer.Option(help="Checkpoint step (default: newest).")] = None,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="Output format.")] = (
        ExportFormat.safetensors),
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: ./<job id>-step<N>).")
    ] = None,
    dtype: Annotated[
        ExportDtype | None, typer.Option(help="Cast weights (default: keep the checkpoint's).")
    ] = None,
    naming: Annotated[
        ExportNaming, typer.Option(help="Parameter names: etrain's, or Hugging Face Llama's.")
    ] = ExportNaming.etrain,
) -> None:
    """Export a job's checkpoint as one model.safetensors plus config.json (reads storage directly)."""
    with _api_errors():
        try:
            result = export_job(_client(ctx), job_id, step=step, out=out, dtype=dtype,
                                naming=naming)
        except ExportRefused as e:
            raise _fail(str(e)) from None
    console.print(
        f"exported job {job_id} step {result.step} ({result.preset}, {result.num_params:,} "
        f"parameters, {result.dtype}, {result.naming} names) to {result.out_dir}: "
        f"model.safetensors ({result.bytes:,} bytes), config.json, etrain_export.json",
        markup=False,
    )


if __name__ == "__main__":
    app()
