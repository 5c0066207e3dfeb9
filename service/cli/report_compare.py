"""``etrain report compare``: one spec under each of a few strategies, side by side.

The runs go as every report's do (:mod:`service.cli.report`): each strategy's variant
is planned first, then submitted as ``report-compare-<strategy>`` and watched to its
end, one after another; Ctrl-C cancels the job in flight. The table gives each one's
throughput (relative to the first strategy named), the peak memory its ranks measured
and the planner's prediction, and ``compare.png`` draws both.
"""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.common import SpecArg
from service.cli.report import (
    STRATEGIES_HELP,
    OutOpt,
    StepsOpt,
    WarmupOpt,
    finish,
    make_out_dir,
    spec_errors,
    start_runs,
    strategy_names,
)
from service.reports import tables, variants

DEFAULT = "zero3,ds-zero3"  # FSDP ZeRO-3 against DeepSpeed ZeRO-3


def compare(
    ctx: typer.Context,
    spec: SpecArg,
    strategies: Annotated[
        str, typer.Option(help=STRATEGIES_HELP + " At least 2; the first is the baseline.")
    ] = DEFAULT,
    steps: StepsOpt = None,
    warmup: WarmupOpt = 2,
    out: OutOpt = None,
) -> None:
    """Throughput and memory per rank of SPEC under each strategy, side by side.

    Tokens/s and step time after warm-up, throughput relative to the first strategy, the
    peak memory of the rank holding most (measured) and the planner's device bytes.
    """
    runs, body = start_runs(ctx, spec)
    names = strategy_names(strategies)
    with spec_errors(runs.s):
        specs = variants.memory_specs(
            body, kind="compare", steps=steps, strategies=names, at_least=2
        )
    predicted = {name: tables.predicted_row(name, runs.plan(one)).total for name, one in specs}
    out_dir = make_out_dir(runs.s, out, "compare")
    measured = []
    with runs.cancelling():
        for name, one in specs:
            job = runs.run(one)
            speed, peak = runs.speed(job, warmup), tables.peak_bytes(runs.memory(job))
            measured.append((name, speed, peak, predicted[name], job["id"]))
    rows = tables.compare_rows(measured)
    from service.reports import plots

    png = plots.compare_png(rows, out_dir / "compare.png")
    intro = [
        f"Spec `{spec.name}` as {', '.join(names)}; first {warmup} steps left out; "
        f"relative to {names[0]}. Peak: the highest peak bytes a rank measured (on a GPU "
        "the allocator's peak); predicted: the planner's device bytes of its worst rank."
    ]
    finish(runs.s, out_dir, "Strategies compared", intro, tables.compare_table(rows), [png])


def register(reports: typer.Typer) -> None:
    """Add ``compare`` to the ``report`` app."""
    reports.command()(compare)
