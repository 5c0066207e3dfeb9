"""``etrain serve``, ``submit``, ``jobs``, ``status``, ``logs``, ``cancel``: running and
watching jobs."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column, Table

from service.cli.common import (
    EXIT_INTERRUPTED,
    JobIdArg,
    Session,
    SpecArg,
    client,
    content_type,
    event_line,
    fmt,
    session,
    total_steps,
)
from service.client import EtrainClient
from service.status import TERMINAL

TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


def eval_text(metrics: dict[str, Any] | None) -> str | None:
    """``X (ppl Y) at step S``: the newest evaluation a job's metrics keep; None without one."""
    metrics = metrics or {}
    if metrics.get("eval_loss") is None:
        return None
    text = fmt(metrics["eval_loss"])
    if metrics.get("eval_perplexity") is not None:
        text += f" (ppl {fmt(metrics['eval_perplexity'])})"
    if metrics.get("eval_step") is not None:
        text += f" at step {metrics['eval_step']}"
    return text


def rewards_text(metrics: dict[str, Any] | None) -> str | None:
    """``reward accuracy A, margin M``: objective dpo's newest step; None for others."""
    metrics = metrics or {}
    if metrics.get("rewards_accuracy") is None:
        return None
    return (
        f"reward accuracy {fmt(metrics['rewards_accuracy'])}, "
        f"margin {fmt(metrics.get('rewards_margin'))}"
    )


def _print_final(s: Session, job: dict[str, Any]) -> int:
    """Print the outcome of a finished job and return its exit code."""
    metrics = job.get("metrics") or {}
    evaluated = eval_text(metrics)
    rewards = rewards_text(metrics)
    s.console.print(
        f"job {job['id']} {job['status']} at step {job.get('step')}, "
        f"loss {fmt(metrics.get('loss'))}"
        + (f", eval loss {evaluated}" if evaluated else "")
        + (f", {rewards}" if rewards else ""),
        markup=False,
    )
    if job.get("error"):
        s.err_console.print(f"error: {job['error']}", markup=False)
    return 0 if job["status"] == "SUCCEEDED" else 1


def _rate(job: dict[str, Any], metrics: dict) -> str:
    """Tokens per second, or images per second for an image model's job."""
    if ((job.get("spec") or {}).get("objective")) == "diffusion":
        return f"{fmt(metrics.get('samples_per_s'), ',.1f')} images/s"
    return f"{fmt(metrics.get('tokens_per_s'), ',.0f')} tok/s"


def _progress_fields(job: dict[str, Any]) -> dict[str, Any]:
    """The columns of the follow progress bar for one job snapshot."""
    metrics = job.get("metrics") or {}
    evaluated = metrics.get("eval_loss")
    return {
        "completed": job.get("step") or 0,
        "description": job.get("status", "?"),
        "loss": fmt(metrics.get("loss"))
        + (f" eval {fmt(evaluated)}" if evaluated is not None else ""),
        "tps": _rate(job, metrics),
        "ws": fmt(job.get("world_size") or metrics.get("world_size")),
    }


def watch(s: Session, api: EtrainClient, job: dict[str, Any]) -> dict[str, Any]:
    """Poll a job, printing new events above a progress bar, until it is terminal; return
    its last snapshot. A Ctrl-C (KeyboardInterrupt) is left to the caller."""
    job_id, last_event = job["id"], None
    progress = Progress(
        TextColumn("{task.description:<9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]}"),
        TextColumn("world {task.fields[ws]}"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=s.console,
    )
    with progress:
        fields = _progress_fields(job)
        task = progress.add_task(fields.pop("description"), total=total_steps(job), **fields)
        while True:
            job = api.get_job(job_id)
            for event in api.get_events(job_id, after_id=last_event):
                progress.console.print(event_line(event), markup=False)
                last_event = event.get("id", last_event)
            progress.update(task, total=total_steps(job), **_progress_fields(job))
            if job.get("status") in TERMINAL_NAMES:
                return job
            s.pause()


def _follow(s: Session, api: EtrainClient, job: dict[str, Any]) -> int:
    """Watch a job until it ends and return its exit code; Ctrl-C stops following only."""
    try:
        job = watch(s, api, job)
    except KeyboardInterrupt:
        s.err_console.print(
            f"stopped following; job {job['id']} keeps running. Resume with "
            f"`etrain status {job['id']}` or `etrain logs {job['id']} -f`.",
            markup=False,
        )
        return EXIT_INTERRUPTED
    return _print_final(s, job)


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


def submit(
    ctx: typer.Context,
    spec: SpecArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow progress until the job ends.")
    ] = False,
    name: Annotated[str | None, typer.Option(help="Override the spec's name.")] = None,
) -> None:
    """Submit a job spec; with --follow, show progress and events until it finishes."""
    s, api = session(ctx), client(ctx)
    with s.api_errors():
        if name is None:
            # Sent as-is so the server's errors point at the user's own file.
            job = api.submit_job(spec.read_bytes(), content_type(spec))
        else:
            body = s.load_file(spec)
            if not isinstance(body, dict):
                raise s.fail(f"{spec} is not a mapping")
            job = api.submit_job({**body, "name": name})
        s.console.print(
            f"submitted job {job['id']} ({job.get('name')}): {job.get('status')}", markup=False
        )
        for warning in job.get("warnings") or []:
            s.err_console.print(f"warning: {warning}", markup=False)
        if follow:
            raise typer.Exit(_follow(s, api, job))


def jobs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many jobs.")] = None,
) -> None:
    """List jobs as a table (filter by --status, cap with --limit)."""
    s = session(ctx)
    with s.api_errors():
        page = client(ctx).list_jobs(status=status.upper() if status else None, limit=limit)
    items = page.get("items", [])
    # An eval loss column only when a listed job has evaluated.
    evals = any((job.get("metrics") or {}).get("eval_loss") is not None for job in items)
    headers = ["name", "status", "step", "loss", *(["eval loss"] if evals else []), "world"]
    table = Table(*headers, "created")
    # Ids must stay copyable whole, so they get a column rich may not fold or cut.
    table.columns.insert(0, Column("id", no_wrap=True, min_width=14))
    for job in items:
        total, metrics = total_steps(job), job.get("metrics") or {}
        table.add_row(
            job["id"],
            job.get("name") or "",
            job.get("status") or "",
            f"{job.get('step') or 0}/{total if total is not None else '?'}",
            fmt(metrics.get("loss")),
            *([fmt(metrics.get("eval_loss"))] if evals else []),
            fmt(job.get("world_size")),
            str(job.get("created_at") or "")[:19].replace("T", " "),
        )
    s.console.print(table)
    s.console.print(f"{len(items)} of {page.get('total', '?')} jobs", markup=False)


def tensorboard_line(job: dict[str, Any]) -> str | None:
    """The command that shows the job's TensorBoard event files, when it writes them
    (metrics.tensorboard: rank 0 writes them beside the checkpoints, local or object store;
    TensorBoard reads s3:// with boto3, at S3_ENDPOINT when that is set, and gs:// with gcsfs)."""
    spec = job.get("spec") or {}
    checkpoint = spec.get("checkpoint") or {}
    storage = (checkpoint.get("storage") or "").rstrip("/")
    if not (spec.get("metrics") or {}).get("tensorboard") or "://" not in storage:
        return None
    logdir = f"{storage.removeprefix('file://')}/{job.get('id')}/checkpoints/tensorboard"
    # stores.s3; checkpoint.s3 in a spec from a service older than the stores section
    s3 = (spec.get("stores") or {}).get("s3") or checkpoint.get("s3") or {}
    s3_endpoint = s3.get("endpoint_url")
    prefix = f"S3_ENDPOINT={s3_endpoint} " if s3_endpoint and storage.startswith("s3://") else ""
    return f"{prefix}tensorboard --logdir {logdir}"


def ray_dashboard_line(job: dict[str, Any]) -> str | None:
    """``Ray dashboard: <job page> (sign in with the Ray token in <where>)``."""
    url = (job.get("dashboard_links") or {}).get("job") or job.get("dashboard_url")
    if not url:
        return None
    hint = job.get("dashboard_token_hint")
    return f"Ray dashboard: {url}" + (f" ({hint})" if hint else "")


def _print_summary(s: Session, job: dict[str, Any]) -> None:
    """The human view of one job object."""
    total, evaluated = total_steps(job), eval_text(job.get("metrics"))
    rows = [
        ("id", job.get("id")),
        ("name", job.get("name")),
        ("status", job.get("status")),
        ("step", f"{job.get('step') or 0}/{total if total is not None else '?'}"),
        ("world size", job.get("world_size")),
        *([("eval loss", evaluated)] if evaluated else []),
        *([("rewards", rewards)] if (rewards := rewards_text(job.get("metrics"))) else []),
        ("restarts", job.get("restarts")),
        ("curves", tensorboard_line(job)),
        ("created", job.get("created_at")),
        ("started", job.get("started_at")),
        ("finished", job.get("finished_at")),
    ]
    metrics = job.get("metrics")
    if metrics:
        rows.append(("metrics", "  ".join(f"{k}={fmt(v)}" for k, v in metrics.items())))
    rows += [("warning", w) for w in job.get("warnings") or []]
    if job.get("error"):
        rows.append(("error", job["error"]))
    for key, value in rows:
        s.console.print(f"{key:<11}{'-' if value is None else value}", markup=False)
    dashboard = ray_dashboard_line(job)
    if dashboard:
        s.console.print(dashboard, markup=False, soft_wrap=True)


def status(
    ctx: typer.Context,
    job_id: Annotated[
        str | None, typer.Argument(help="Job id; without it, the cluster and its warm pool.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show one job: status, progress, latest metrics, and its last 10 events. Without a
    job id: the cluster's nodes, its queue and its warm pool (standby drivers, budget)."""
    s, api = session(ctx), client(ctx)
    if job_id is None:
        with s.api_errors():
            cluster = api.get_cluster()
        if as_json:
            typer.echo(json.dumps(cluster, indent=2))
            return
        for line in cluster_lines(cluster):
            s.console.print(line, markup=False)
        return
    with s.api_errors():
        job = api.get_job(job_id)
        if as_json:
            typer.echo(json.dumps(job, indent=2))
            return
        events = api.get_events(job_id)
    _print_summary(s, job)
    if events:
        s.console.print("events:")
        for event in events[-10:]:
            s.console.print(f"  {event_line(event)}", markup=False)


def cluster_lines(cluster: dict[str, Any]) -> list[str]:
    """``etrain status`` without a job: nodes, resources, the queue, the warm pool."""
    total, free = cluster.get("total") or {}, cluster.get("available") or {}
    lines = [
        f"nodes      {len(cluster.get('nodes') or [])}",
        f"CPUs       {free.get('CPU', 0):g} free of {total.get('CPU', 0):g}"
        + (f", GPUs {free.get('GPU', 0):g} free of {total['GPU']:g}" if total.get("GPU") else ""),
        f"queue      {len(cluster.get('queue') or [])} job(s) waiting",
    ]
    pool = cluster.get("standby")
    if not pool:
        return [*lines, "warm pool  none (ETRAIN_STANDBY_DRIVERS=0): every job starts cold"]
    state = (
        "stopped after its idle time; the next job brings it back"
        if pool.get("shrunk")
        else f"{pool['warm']} warm, {pool['idle'] - pool['warm']} warming, "
        f"{pool.get('busy', 0)} running a job"
    )
    lines.append(f"warm pool  {pool['configured']} standby driver(s) kept: {state}")
    lines.append(
        f"  holds    {pool.get('processes', 0)} processes, "
        f"{pool['memory_bytes'] / 1e9:.2f} GB of host memory (PSS)"
    )
    budget = pool.get("budget")
    if budget:
        lines.append(
            f"  budget   {budget['processes']} processes, {budget['memory_bytes'] / 1e9:.2f} GB; "
            f"stops after {budget['idle_s']:g} s without a job"
        )
    return lines


def logs(
    ctx: typer.Context,
    job_id: JobIdArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream until the job ends.")
    ] = False,
) -> None:
    """Print a job's driver and worker logs; -f streams them as they arrive."""
    s, api = session(ctx), client(ctx)
    with s.api_errors():
        if not follow:
            typer.echo(api.get_logs(job_id), nl=False)
            return
        try:
            for chunk in api.stream_logs(job_id):
                typer.echo(chunk, nl=False)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


def cancel(ctx: typer.Context, job_id: JobIdArg) -> None:
    """Cancel a job (a no-op for a job that already finished)."""
    s = session(ctx)
    with s.api_errors():
        job = client(ctx).cancel_job(job_id)
    s.console.print(f"job {job.get('id', job_id)}: {job.get('status')}", markup=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    for command in (serve, submit, jobs, status, logs, cancel):
        app.command()(command)
