"""The numbers of each report, from the JSON the REST API returns (no I/O here).

Throughput leaves out the first ``warmup`` steps (start-up, first allocations,
compilation of kernels) and weighs each step by its time: tokens of the measured
steps over their summed step time, not a mean of per-step rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

GIB = 1024**3
COMPONENTS = ("params", "grads", "optimizer", "activations")
# The objectives' frozen modules, measured as ``<name>_bytes`` (a DPO reference model; a
# diffusion job's VAE and text encoder); the plan counts them among its buffers.
FROZEN_PARTS = ("reference", "vae", "text_encoder")
MARKER_KINDS = ("restored", "resized", "worker_failed", "checkpoint_saved", "resubmitted")


@dataclass(frozen=True)
class Table:
    """A titled table of formatted cells, printed in the terminal and written to report.md."""

    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]


@dataclass(frozen=True)
class Throughput:
    """Steady-state speed of one run."""

    tokens_per_s: float
    samples_per_s: float
    step_time_s: float
    steps: int


def steady_points(points: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The points after the first ``warmup`` steps, one per step (a step re-run after a
    restart keeps its newest point), ascending."""
    by_step = {int(p["step"]): p for p in points if isinstance(p.get("step"), int)}
    return [by_step[s] for s in sorted(by_step) if s > warmup]


def throughput(points: list[dict[str, Any]], warmup: int) -> Throughput:
    """Tokens/s and samples/s over the steps after warm-up; ValueError when none are left."""
    kept = [
        p
        for p in steady_points(points, warmup)
        if (p.get("step_time_s") or 0) > 0 and p.get("tokens_per_s") is not None
    ]
    if not kept:
        raise ValueError(f"no timed steps after the first {warmup} (warm-up); run more steps")
    seconds = sum(p["step_time_s"] for p in kept)
    tokens = sum(p["tokens_per_s"] * p["step_time_s"] for p in kept)
    samples = sum((p.get("samples_per_s") or 0) * p["step_time_s"] for p in kept)
    return Throughput(tokens / seconds, samples / seconds, seconds / len(kept), len(kept))


@dataclass(frozen=True)
class ScalingRow:
    """One world size of a scaling run against the smallest one."""

    workers: int
    speed: Throughput
    speedup: float
    ideal: float
    efficiency: float
    job_id: str = ""


def scaling_rows(runs: list[tuple[int, Throughput, str]]) -> list[ScalingRow]:
    """Speedup against the smallest world size, the ideal (n / n0), and their ratio."""
    runs = sorted(runs, key=lambda r: r[0])
    if not runs:
        return []
    n0, base = runs[0][0], runs[0][1].tokens_per_s
    rows = []
    for n, speed, job_id in runs:
        speedup, ideal = speed.tokens_per_s / base, n / n0
        rows.append(ScalingRow(n, speed, speedup, ideal, speedup / ideal, job_id))
    return rows


def scaling_table(rows: list[ScalingRow]) -> Table:
    """Workers, throughput, speedup, ideal and efficiency."""
    return Table(
        "scaling",
        ("workers", "tokens/s", "samples/s", "step s", "speedup", "ideal", "efficiency", "job"),
        [
            (
                str(r.workers),
                f"{r.speed.tokens_per_s:.1f}",
                f"{r.speed.samples_per_s:.2f}",
                f"{r.speed.step_time_s:.4f}",
                f"{r.speedup:.3f}",
                f"{r.ideal:.3f}",
                f"{r.efficiency:.3f}",
                r.job_id,
            )
            for r in rows
        ],
    )


@dataclass(frozen=True)
class MemoryRow:
    """Bytes per rank of one strategy, measured or predicted, by component."""

    strategy: str
    source: str  # measured | predicted
    parts: dict[str, int]  # COMPONENTS
    other: int  # measured: gathered parameters and frozen parts; predicted: buffers
    host: int | None = None  # predicted host bytes per rank (CPU offload)
    buckets: int | None = None  # measured: DeepSpeed's reduce buckets (the plan: in buffers)

    @property
    def state(self) -> int:
        """Parameters, gradients and optimizer state."""
        return self.parts["params"] + self.parts["grads"] + self.parts["optimizer"]

    @property
    def total(self) -> int:
        """Every component, the buckets and the other bytes."""
        return sum(self.parts.values()) + (self.buckets or 0) + self.other


def _int(value: Any) -> int:
    """A byte count from JSON (missing or malformed = 0)."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def measured_row(strategy: str, ranks: list[dict[str, Any]]) -> MemoryRow | None:
    """The rank holding the most (state and activations); None before any report."""
    rows = [
        MemoryRow(
            strategy,
            "measured",
            {c: _int(r.get(f"{c}_bytes")) for c in COMPONENTS},
            _int(r.get("gathered_params_bytes"))
            + sum(_int(r.get(f"{name}_bytes")) for name in FROZEN_PARTS),
            buckets=_int(r.get("buckets_bytes")),
        )
        for r in ranks
        if isinstance(r, dict)
    ]
    return max(rows, key=lambda r: sum(r.parts.values()), default=None)


def peak_bytes(ranks: list[dict[str, Any]]) -> int | None:
    """The highest ``peak_bytes`` of the ranks (device memory allocated at its peak on a
    GPU; on a CPU every part measured); None when no rank reported one."""
    peaks = [_int(r.get("peak_bytes")) for r in ranks if isinstance(r, dict)]
    return max(peaks) if any(peaks) else None


def predicted_row(strategy: str, plan: dict[str, Any]) -> MemoryRow:
    """The planner's worst rank (device bytes; host bytes beside them)."""
    per_rank = plan.get("per_rank") or {}
    host = (plan.get("breakdown") or {}).get("host_bytes")
    parts = {c: _int(per_rank.get(f"{c}_bytes")) for c in COMPONENTS}
    return MemoryRow(
        strategy, "predicted", parts, _int(per_rank.get("buffers_bytes")), _int(host) or None
    )


def mib(n: int | None) -> str:
    """Bytes as MiB with two decimals ('-' when unknown)."""
    return "-" if n is None else f"{n / 2**20:.2f}"


def memory_table(rows: list[MemoryRow]) -> Table:
    """One line per strategy and source, in MiB per rank."""
    return Table(
        "memory per rank (MiB)",
        ("strategy", "source", *COMPONENTS, "buckets", "other", "state", "total", "host"),
        [
            (
                r.strategy,
                r.source,
                *(mib(r.parts[c]) for c in COMPONENTS),
                mib(r.buckets),
                mib(r.other),
                mib(r.state),
                mib(r.total),
                mib(r.host),
            )
            for r in rows
        ],
    )


@dataclass(frozen=True)
class CompareRow:
    """One strategy of a comparison: its speed against the first one's, its memory."""

    strategy: str
    speed: Throughput
    relative: float
    peak: int | None  # measured: the highest peak_bytes of its ranks
    predicted: int  # the plan's device bytes of its worst rank
    job_id: str = ""


def compare_rows(runs: list[tuple[str, Throughput, int | None, int, str]]) -> list[CompareRow]:
    """(strategy, speed, measured peak, predicted bytes, job) runs, in the order given,
    throughput relative to the first."""
    if not runs:
        return []
    base = runs[0][1].tokens_per_s
    return [CompareRow(n, s, s.tokens_per_s / base, p, d, j) for n, s, p, d, j in runs]


def compare_table(rows: list[CompareRow]) -> Table:
    """Strategy, job, throughput (relative to the first) and memory per rank in MiB."""
    return Table(
        "strategies compared",
        ("strategy", "job", "tokens/s", "step ms", "relative", "peak MiB", "predicted MiB"),
        [
            (
                r.strategy,
                r.job_id,
                f"{r.speed.tokens_per_s:.1f}",
                f"{r.speed.step_time_s * 1000:.1f}",
                f"{r.relative:.3f}",
                mib(r.peak),
                mib(r.predicted),
            )
            for r in rows
        ],
    )


@dataclass(frozen=True)
class AccumulationRow:
    """One micro-batch size at a fixed global batch."""

    micro: int
    accumulation: int
    speed: Throughput
    relative: float
    job_id: str = ""


def accumulation_rows(runs: list[tuple[int, int, Throughput, str]]) -> list[AccumulationRow]:
    """(micro, accumulation steps, speed, job) runs, relative to the first one given."""
    if not runs:
        return []
    base = runs[0][2].tokens_per_s
    return [AccumulationRow(m, a, s, s.tokens_per_s / base, j) for m, a, s, j in runs]


def accumulation_table(rows: list[AccumulationRow]) -> Table:
    """Micro-batch, accumulation steps, throughput and throughput relative to the first."""
    return Table(
        "gradient accumulation",
        ("micro", "accumulation", "tokens/s", "samples/s", "step s", "relative", "job"),
        [
            (
                str(r.micro),
                str(r.accumulation),
                f"{r.speed.tokens_per_s:.1f}",
                f"{r.speed.samples_per_s:.2f}",
                f"{r.speed.step_time_s:.4f}",
                f"{r.relative:.3f}",
                r.job_id,
            )
            for r in rows
        ],
    )


def series(points: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric, skipping steps without it."""
    kept = [p for p in steady_points(points, 0) if isinstance(p.get(key), int | float)]
    return [p["step"] for p in kept], [float(p[key]) for p in kept]


def _when(value: Any) -> float | None:
    """An ISO time or epoch seconds as epoch seconds."""
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def markers(events: list[dict[str, Any]], points: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(step, kind) of restarts, resizes, failures and checkpoints: the event's own step
    when it names one, else the first step that ended after it."""
    timed = [(t, p["step"]) for p in steady_points(points, 0) if (t := _when(p.get("ts")))]
    out = []
    for event in events:
        if event.get("kind") not in MARKER_KINDS:
            continue
        step = (event.get("data") or {}).get("step")
        if not isinstance(step, int):
            at = _when(event.get("ts"))
            later = [s for t, s in timed if at is not None and t >= at]
            step = later[0] if later else (timed[-1][1] if timed else None)
        if step is not None:
            out.append((step, str(event["kind"])))
    return out


def goodput_parts(goodput: dict[str, Any]) -> list[tuple[str, float]]:
    """(name, seconds): productive time first, then each cause of lost time."""
    parts = [("productive", float(goodput.get("productive_s") or 0))]
    for name, value in (goodput.get("breakdown") or {}).items():
        parts.append((name.removesuffix("_s").replace("_", " "), float(value or 0)))
    return parts


def job_table(job: dict[str, Any], points: list[dict[str, Any]], goodput: dict[str, Any]) -> Table:
    """One job at a glance: steps, loss (and eval loss if it evaluated; a DPO job's rewards),
    speed, restarts and goodput with its breakdown."""
    _, losses = series(points, "loss")
    eval_steps, eval_losses = series(points, "eval_loss")
    _, rates = series(points, "tokens_per_s")
    _, accuracy = series(points, "rewards_accuracy")  # objective dpo
    _, margins = series(points, "rewards_margin")
    wall = float(goodput.get("wall_s") or 0)
    rows = [
        ("job", str(job.get("id"))),
        ("status", str(job.get("status"))),
        ("steps", str(len(steady_points(points, 0)))),
        ("first loss", f"{losses[0]:.4f}" if losses else "-"),
        ("final loss", f"{losses[-1]:.4f}" if losses else "-"),
        *(
            [("final eval loss", f"{eval_losses[-1]:.4f} at step {eval_steps[-1]}")]
            if eval_losses
            else []
        ),
        *(
            [
                ("final reward accuracy", f"{accuracy[-1]:.4f}"),
                ("final reward margin", f"{margins[-1]:.4f}"),
            ]
            if accuracy and margins
            else []
        ),
        ("mean tokens/s", f"{sum(rates) / len(rates):.1f}" if rates else "-"),
        ("restarts", str(job.get("restarts") or 0)),
        ("goodput", f"{float(goodput.get('goodput') or 0):.3f}"),
        ("wall s", f"{wall:.2f}"),
    ]
    rows += [(f"{name} s", f"{seconds:.2f}") for name, seconds in goodput_parts(goodput)]
    return Table("job", ("field", "value"), rows)
