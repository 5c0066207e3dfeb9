"""The reports' pictures: each function takes a report's rows and writes one PNG.

matplotlib is imported here only, with the Agg backend (no display needed);
the CLI imports this module when a report is drawn, never at start-up. Every
figure is ``FIGSIZE`` inches at ``DPI``, so a PNG is ``PIXELS`` wide and high.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from service.reports.tables import (
    COMPONENTS,
    AccumulationRow,
    CompareRow,
    MemoryRow,
    ScalingRow,
)

DPI = 100
FIGSIZE = (11.0, 4.5)
PIXELS = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))
MIB = 2**20
COLORS = {
    "params": "#4c72b0",
    "grads": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "buckets": "#937860",
    "other": "#8172b3",
}
# What the memory legend's two catch-all parts hold, measured and predicted.
LEGEND_TITLE = (
    "component\n(buckets: DeepSpeed's reduce\nbuckets, measured; other:\ngathered params and"
    "\nfrozen parts measured,\nbuffers predicted)"
)
MARKER_STYLE = {
    "checkpoint_saved": ("#55a868", ":"),
    "restored": ("#c44e52", "--"),
    "resubmitted": ("#c44e52", "-."),
    "worker_failed": ("#000000", "-"),
    "resized": ("#8172b3", "--"),
}


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG of PIXELS and close it."""
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return path


def scaling_png(rows: list[ScalingRow], path: Path) -> Path:
    """Throughput and speedup against workers, the ideal line, efficiency at each point."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, layout="constrained")
    workers = [r.workers for r in rows]
    left.plot(workers, [r.speed.tokens_per_s for r in rows], "o-", label="measured")
    n0, base = rows[0].workers, rows[0].speed.tokens_per_s
    left.plot(workers, [base * n / n0 for n in workers], "k--", label="ideal")
    left.set(xlabel="workers", ylabel="tokens/s", title="throughput (after warm-up)")
    right.plot(workers, [r.speedup for r in rows], "o-", label="speedup")
    right.plot(workers, [r.ideal for r in rows], "k--", label="ideal (n / n0)")
    for r in rows:
        right.annotate(
            f"eff {r.efficiency:.0%}",
            (r.workers, r.speedup),
            textcoords="offset points",
            xytext=(4, -14),
        )
    right.set(xlabel="workers", ylabel=f"speedup vs {n0} worker(s)", title="speedup")
    for ax in (left, right):
        ax.set_xticks(workers)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def _part(row: MemoryRow, part: str) -> int:
    """Bytes of one stacked part of ``row``."""
    if part == "other":
        return row.other
    return (row.buckets or 0) if part == "buckets" else row.parts[part]


def memory_png(rows: list[MemoryRow], path: Path) -> Path:
    """Stacked bars per rank: each strategy's measured and predicted side by side."""
    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    width = 0.38
    for offset, source, hatch in ((-width / 2, "measured", ""), (width / 2, "predicted", "//")):
        mine = {r.strategy: r for r in rows if r.source == source}
        xs = [i + offset for i, s in enumerate(strategies) if s in mine]
        picked = [mine[s] for s in strategies if s in mine]
        bottom = [0.0] * len(picked)
        for part in (*COMPONENTS, "buckets", "other"):
            values = [_part(r, part) / MIB for r in picked]
            label = part if source == "measured" else None
            ax.bar(xs, values, width, bottom=bottom, color=COLORS[part], hatch=hatch, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for x, top in zip(xs, bottom, strict=True):
            ax.annotate(source[0], (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(strategies)), strategies, rotation=20, ha="right")
    ax.set(ylabel="MiB per rank", title="memory per rank: m = measured, p = predicted (hatched)")
    ax.legend(title=LEGEND_TITLE, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _speed_bars(ax, labels: list[str], rows: list[AccumulationRow] | list[CompareRow]) -> None:
    """Tokens/s of each row as a bar labelled ``labels``, its relative speed on top."""
    bars = ax.bar(labels, [r.speed.tokens_per_s for r in rows], color=COLORS["params"])
    for bar, r in zip(bars, rows, strict=True):
        ax.annotate(
            f"{r.relative:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
        )


def accumulation_png(rows: list[AccumulationRow], path: Path) -> Path:
    """Throughput per micro-batch size at the fixed global batch."""
    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    labels = [f"micro {r.micro}\n{r.accumulation} accum." for r in rows]
    _speed_bars(ax, labels, rows)
    ax.set(ylabel="tokens/s (after warm-up)", title="gradient accumulation at a fixed global batch")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def compare_png(rows: list[CompareRow], path: Path) -> Path:
    """Throughput (relative to the first annotated) and peak memory per rank, per strategy;
    the planner's prediction beside each measured peak."""
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, layout="constrained")
    names = [r.strategy for r in rows]
    _speed_bars(left, names, rows)
    left.set(ylabel="tokens/s (after warm-up)", title=f"throughput, relative to {names[0]}")
    xs = range(len(rows))
    width = 0.38
    peaks = [(r.peak or 0) / MIB for r in rows]
    right.bar([x - width / 2 for x in xs], peaks, width, color=COLORS["activations"], label="peak")
    predicted = [r.predicted / MIB for r in rows]
    right.bar(
        [x + width / 2 for x in xs],
        predicted,
        width,
        color=COLORS["other"],
        hatch="//",
        label="predicted",
    )
    right.set_xticks(list(xs), names)
    right.set(ylabel="MiB per rank", title="memory of the rank holding most")
    right.legend()
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def curves_png(
    curves: dict[str, tuple[list[int], list[float]]],
    marks: list[tuple[int, str]],
    path: Path,
) -> Path:
    """One panel per metric against step, with a vertical line at each marked event."""
    fig, axes = plt.subplots(1, len(curves), figsize=FIGSIZE, layout="constrained", squeeze=False)
    seen: set[str] = set()
    for ax, (name, (steps, values)) in zip(axes[0], curves.items(), strict=True):
        ax.plot(steps, values, "-", marker="." if len(steps) < 40 else None)
        ax.set(xlabel="step", title=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        for step, kind in marks:
            color, style = MARKER_STYLE.get(kind, ("#999999", ":"))
            label = kind if kind not in seen else None
            seen.add(kind)
            ax.axvline(step, color=color, linestyle=style, alpha=0.7, label=label)
    if marks:
        fig.legend(loc="outside lower center", ncols=len(seen))
    return _save(fig, path)


def goodput_png(parts: list[tuple[str, float]], goodput: float, path: Path) -> Path:
    """Where the wall time went: productive time and each cause of loss, in seconds."""
    fig, ax = plt.subplots(figsize=FIGSIZE, layout="constrained")
    names = [n for n, _ in parts]
    seconds = [s for _, s in parts]
    colors = [COLORS["optimizer"]] + [COLORS["activations"]] * (len(parts) - 1)
    ax.barh(names, seconds, color=colors)
    for y, s in enumerate(seconds):
        ax.annotate(f"{s:.1f}s", (s, y), xytext=(3, 0), textcoords="offset points", va="center")
    ax.invert_yaxis()
    ax.set(xlabel="seconds", title=f"goodput {goodput:.1%}: productive time over wall time")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)
