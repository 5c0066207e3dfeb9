"""``etrain report scaling|memory|accumulation|job``: run a spec's variants, or read one job,
and write tables and PNGs (with a ``report.md`` that embeds them) into ``--out``.
``report compare`` (:mod:`service.cli.report_compare`) runs on what this module shares.

Each variant is planned first (``POST /v1/plan``: a bad variant fails before any job
runs), then submitted as ``report-<kind>-<variant>`` and watched to its end, one
after another. Ctrl-C cancels the job in flight. The numbers come from
:mod:`service.reports.tables`; the pictures (matplotlib, imported only here, when
a report is drawn) from :mod:`service.reports.plots`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table as RichTable

from service.cli.common import EXIT_INTERRUPTED, JobIdArg, Session, SpecArg, client, session
from service.cli.jobs import watch
from service.client import EtrainClient
from service.reports import tables, variants
from service.reports.markdown import default_out, write_report
from service.reports.tables import Table

report_app = typer.Typer(
    help="Reports as pictures: scaling, memory per strategy, gradient accumulation, one job, "
    "strategies compared.",
    no_args_is_help=True,
)

OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        file_okay=False,
        help="Directory for the PNGs and report.md (default ./etrain-report-<kind>-<time>).",
    ),
]
StepsOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Override train.steps of every run (default: the spec's)."),
]
WarmupOpt = Annotated[
    int, typer.Option(min=0, help="Leading steps left out of throughput (warm-up).")
]
STRATEGIES_HELP = "Which of " + ", ".join(variants.MEMORY_STRATEGIES) + " to run, comma-separated."


def _ints(text: str, option: str) -> list[int]:
    """``1,2,4`` as distinct positive integers in the order given."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise typer.BadParameter(f"{text!r}: give distinct integers >= 1, e.g. 1,2,4")
    if len(values) > 16:
        raise typer.BadParameter(f"{text!r}: at most 16 values")
    return values


@dataclasses.dataclass
class Runs:
    """Submits specs one after another and watches each; knows the job in flight."""

    s: Session
    api: EtrainClient
    in_flight: str | None = None

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The plan of ``spec``; exit 2 with the planner's errors when it cannot run."""
        with self.s.api_errors():
            plan = self.api.plan(spec)
        if plan.get("errors"):
            lines = "\n".join(f"  {e}" for e in plan["errors"])
            raise self.s.fail(f"{spec.get('name')} cannot run:\n{lines}")
        return plan

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit ``spec``, watch it (progress on stderr) and return it; exit 1 unless it
        succeeded."""
        s = self.s
        with s.api_errors():
            job = self.api.submit_job(spec)
            self.in_flight = job["id"]
            s.err_console.print(f"submitted job {job['id']} ({job.get('name')})", markup=False)
            job = watch(dataclasses.replace(s, console=s.err_console), self.api, job)
        self.in_flight = None
        if job.get("status") != "SUCCEEDED":
            why = f": {job['error']}" if job.get("error") else ""
            raise s.fail(f"job {job['id']} ({job.get('name')}) {job.get('status')}{why}", 1)
        return job

    @contextlib.contextmanager
    def cancelling(self) -> Iterator[None]:
        """On Ctrl-C, cancel the job in flight and exit 130."""
        try:
            yield
        except KeyboardInterrupt:
            if self.in_flight is not None:
                with self.s.api_errors():
                    self.api.cancel_job(self.in_flight)
                self.s.err_console.print(f"cancelled job {self.in_flight}", markup=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    def speed(self, job: dict[str, Any], warmup: int) -> tables.Throughput:
        """The job's throughput after warm-up (exit 1 when no step is left to measure)."""
        with self.s.api_errors():
            points = self.api.get_metrics(job["id"])
        try:
            return tables.throughput(points, warmup)
        except ValueError as e:
            raise self.s.fail(f"job {job['id']}: {e}", 1) from None

    def memory(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The memory each rank of the job measured (exit 1 when none reported any)."""
        with self.s.api_errors():
            ranks = self.api.get_memory(job["id"]).get("ranks") or []
        ranks = [r for r in ranks if isinstance(r, dict)]
        if not ranks:
            raise self.s.fail(f"job {job['id']} reported no memory", 1)
        return ranks


def start_runs(ctx: typer.Context, spec: Path) -> tuple[Runs, Any]:
    """The runner and the parsed spec."""
    s = session(ctx)
    body = s.load_file(spec)
    if not isinstance(body, dict):
        raise s.fail(f"{spec} is not a mapping")
    return Runs(s, client(ctx)), body


def make_out_dir(s: Session, out: Path | None, kind: str) -> Path:
    """``out`` (or the default), created."""
    path = out if out is not None else default_out(kind)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise s.fail(f"cannot create {path}: {e}") from None
    return path


def _print(s: Session, table: Table) -> None:
    """The table in the terminal (markdown-shaped, so the numbers stay parseable)."""
    shown = RichTable(*table.headers, title=table.title, box=box.MARKDOWN)
    for row in table.rows:
        shown.add_row(*row)
    s.console.print(shown)


def finish(s: Session, out: Path, title: str, intro: list[str], table: Table, images) -> None:
    """Print the table, write report.md beside the images and say where."""
    _print(s, table)
    report = write_report(out, title, intro, [table], images)
    s.console.print(f"report: {report}", markup=False)


@report_app.command()
def scaling(
    ctx: typer.Context,
    spec: SpecArg,
    workers: Annotated[str, typer.Option(help="World sizes, e.g. 1,2,4.")] = "1,2,4",
    steps: StepsOpt = None,
    warmup: WarmupOpt = 2,
    out: OutOpt = None,
) -> None:
    """Throughput, speedup and efficiency of SPEC at each world size.

    The global batch stays the spec's; speedup is against the smallest size given.
    """
    sizes = sorted(_ints(workers, "--workers"))
    runs, body = start_runs(ctx, spec)
    with spec_errors(runs.s):
        specs = variants.scaling_specs(body, sizes, steps=steps)
    for _, one in specs:
        runs.plan(one)
    out_dir = make_out_dir(runs.s, out, "scaling")
    measured = []
    with runs.cancelling():
        for n, one in specs:
            job = runs.run(one)
            measured.append((n, runs.speed(job, warmup), job["id"]))
    rows = tables.scaling_rows(measured)
    from service.reports import plots

    png = plots.scaling_png(rows, out_dir / "scaling.png")
    intro = [
        f"Spec `{spec.name}` at {', '.join(map(str, sizes))} workers; first {warmup} "
        "steps left out; speedup and efficiency against the smallest size."
    ]
    finish(runs.s, out_dir, "Scaling", intro, tables.scaling_table(rows), [png])


@contextlib.contextmanager
def spec_errors(s: Session) -> Iterator[None]:
    """A spec a variant cannot be made of: exit 2 with why."""
    try:
        yield
    except ValueError as e:
        raise s.fail(str(e)) from None


def strategy_names(text: str) -> list[str]:
    """``ddp,ds-zero3`` as names (checked against MEMORY_STRATEGIES by the variants)."""
    return [n.strip() for n in text.split(",") if n.strip()]


@report_app.command()
def memory(
    ctx: typer.Context,
    spec: SpecArg,
    steps: Annotated[
        int, typer.Option(min=1, help="train.steps of each run (memory is measured at the start).")
    ] = 3,
    strategies: Annotated[str, typer.Option(help=STRATEGIES_HELP)] = ",".join(
        variants.MEMORY_STRATEGIES
    ),
    out: OutOpt = None,
) -> None:
    """Memory per rank of SPEC by ZeRO stage, under FSDP and DeepSpeed.

    DDP, FSDP ZeRO-2, ZeRO-3 and ZeRO-3 + CPU offload, then DeepSpeed ZeRO-0, 1, 2, 3 and
    3 + CPU offload (parameters and optimizer), measured by the workers and predicted by
    the planner, side by side. The DeepSpeed runs keep the spec's own
    parallelism.deepspeed tuning (reduce_bucket_size, ...).
    """
    runs, body = start_runs(ctx, spec)
    with spec_errors(runs.s):
        specs = variants.memory_specs(body, steps=steps, strategies=strategy_names(strategies))
    plans = {name: runs.plan(one) for name, one in specs}
    out_dir = make_out_dir(runs.s, out, "memory")
    rows: list[tables.MemoryRow] = []
    with runs.cancelling():
        for name, one in specs:
            job = runs.run(one)
            measured = tables.measured_row(name, runs.memory(job))  # None: no rank, refused
            rows += [m for m in (measured, tables.predicted_row(name, plans[name])) if m]
    from service.reports import plots

    png = plots.memory_png(rows, out_dir / "memory.png")
    intro = [
        f"Spec `{spec.name}`: bytes per rank (the rank holding most), measured by the "
        "workers and predicted by the planner; buckets = DeepSpeed's reduce buckets "
        "(measured; the plan counts its own among other, its buffers); host = the plan's "
        "host bytes per rank."
    ]
    finish(runs.s, out_dir, "Memory per strategy", intro, tables.memory_table(rows), [png])


@report_app.command()
def accumulation(
    ctx: typer.Context,
    spec: SpecArg,
    micro: Annotated[str, typer.Option(help="Micro-batch sizes, e.g. 1,2,4,8.")] = "1,2,4,8",
    steps: StepsOpt = None,
    warmup: WarmupOpt = 2,
    out: OutOpt = None,
) -> None:
    """Throughput of SPEC at each micro-batch size (fixed global batch).

    The gradient accumulation steps follow: global batch / (micro x data-parallel degree),
    at the degree the API gives for the size each job ran at.
    """
    micros = _ints(micro, "--micro")
    runs, body = start_runs(ctx, spec)
    with spec_errors(runs.s):
        specs = variants.accumulation_specs(body, micros, steps=steps)
    for _, one in specs:
        degrees = runs.plan(one)["layout"]["data_parallel"]  # the API's, at min and max
        with spec_errors(runs.s):
            for dp in sorted({degrees["min"], degrees["max"]}):
                variants.accumulation_steps(one, dp)
    out_dir = make_out_dir(runs.s, out, "accumulation")
    measured = []
    with runs.cancelling():
        for m, one in specs:
            job = runs.run(one)
            degrees = job["data_parallel"]  # at the size the job ran at, once it reported one
            steps_at = variants.accumulation_steps(one, degrees["current"] or degrees["min"])
            measured.append((m, steps_at, runs.speed(job, warmup), job["id"]))
    rows = tables.accumulation_rows(measured)
    from service.reports import plots

    png = plots.accumulation_png(rows, out_dir / "accumulation.png")
    intro = [
        f"Spec `{spec.name}` at micro-batch {', '.join(map(str, micros))}; first "
        f"{warmup} steps left out; relative to micro-batch {micros[0]}."
    ]
    finish(runs.s, out_dir, "Gradient accumulation", intro, tables.accumulation_table(rows), [png])


@report_app.command()
def job(ctx: typer.Context, job_id: JobIdArg, out: OutOpt = None) -> None:
    """One job's curves (loss, eval loss, lr, tokens/s) with event markers, and its goodput.

    Restarts, resizes, failures and checkpoints are marked on the curves.
    """
    s, api = session(ctx), client(ctx)
    with s.api_errors():
        found = api.get_job(job_id)
        points, events = api.get_metrics(job_id), api.get_events(job_id)
        goodput = api.get_goodput(job_id)
    if not points:
        raise s.fail(f"job {job_id} has no metrics yet", 1)
    out_dir = make_out_dir(s, out, "job")
    marks = tables.markers(events, points)
    from service.reports import plots

    curves = (
        ("loss", "loss"),
        ("eval_loss", "eval loss"),  # the steps that evaluated; none for a job that never did
        ("lr", "learning rate"),
        ("tokens_per_s", "tokens/s"),
    )
    images = [
        plots.curves_png({title: tables.series(points, key)}, marks, out_dir / f"{key}.png")
        for key, title in curves
        if tables.series(points, key)[0]
    ]
    images.append(
        plots.goodput_png(
            tables.goodput_parts(goodput),
            float(goodput.get("goodput") or 0),
            out_dir / "goodput.png",
        )
    )
    intro = [
        f"Job `{job_id}` ({found.get('name')}), {found.get('status')}; markers: "
        + (", ".join(sorted({k for _, k in marks})) or "none")
    ]
    finish(s, out_dir, f"Job {job_id}", intro, tables.job_table(found, points, goodput), images)


def register(app: typer.Typer) -> None:
    """Add ``report`` and its subcommands to ``app``."""
    app.add_typer(report_app, name="report")
