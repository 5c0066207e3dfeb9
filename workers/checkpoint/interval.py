"""``checkpoint.interval: auto``: the checkpoint interval from measured cost and failure rate.

Checkpointing more often costs more blocking time; less often loses more work
when a failure rolls the job back to its newest checkpoint. With a blocking cost
δ per checkpoint and a mean time between failures M, the interval that wastes
the least is Young's first-order optimum τ = √(2δM), refined by Daly's
higher-order estimate once δ is no longer small against M.

Everything here is a pure decision, returned as a value: the
policy only accumulates measurements and answers :class:`IntervalDecision`
values; the train loop applies them and records each changed one as an event.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

# Use Young's form while Daly's correction moves τ by at most this fraction. The
# switch then changes τ by <= 1 %, far below CHANGE_THRESHOLD, so crossing it never
# emits an event by itself (a fixed switch at δ = M/2 would drop τ by ~31 %).
YOUNG_TOLERANCE = 0.01
# A new decision is worth applying and recording when its step count moved this much.
CHANGE_THRESHOLD = 0.10
# Blocking times are measured with perf_counter; anything below this is timer noise.
MIN_BLOCKING_S = 1e-3


@dataclass(frozen=True)
class IntervalDecision:
    """How often to checkpoint, and the inputs that chose it.

    ``formula`` is ``"young"`` or ``"daly"``, or ``"initial"`` while no checkpoint
    cost or step time has been measured yet (``steps`` is then the configured
    starting interval). ``seconds`` is the formula's τ, training time between
    checkpoints before the step clamps (for ``"initial"``: the starting interval
    in seconds once the step time is known, else 0); ``steps`` is what to apply.
    """

    seconds: float
    steps: int
    blocking_s: float
    mtbf_s: float
    formula: str
    reason: str

    def as_event_data(self) -> dict:
        """The decision as an event's ``data`` (plain JSON types)."""
        return {
            "seconds": round(self.seconds, 3),
            "steps": self.steps,
            "blocking_s": round(self.blocking_s, 4),
            "mtbf_s": round(self.mtbf_s, 1),
            "formula": self.formula,
        }


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return float(value)


def optimal_interval_s(*, blocking_s: float, mtbf_s: float) -> tuple[float, str]:
    """The checkpoint interval (compute seconds between checkpoints) and the formula used.

    With δ = ``blocking_s`` and M = ``mtbf_s``:

    - Young (1974, "A first order approximation to the optimum checkpoint
      interval"): τ = √(2δM).
    - Daly (2006, "A higher order estimate of the optimum checkpoint interval for
      restart dumps", FGCS 22(3)): τ = √(2δM)·[1 + ⅓·√(δ/(2M)) + (1/9)·(δ/(2M))] − δ
      for δ < 2M, and τ = M for δ ≥ 2M.

    Young's value is returned (``"young"``) while Daly's differs from it by at most
    ``YOUNG_TOLERANCE`` (1 %, i.e. δ/M below about 4.5e-4); otherwise Daly's
    (``"daly"``). τ grows with δ and with M, except for the published form's own
    steps: τ dips by <= 1 % where Young hands over to Daly, and Daly's
    0.89·M at δ = 2M jumps to M.
    """
    delta, mtbf = _positive("blocking_s", blocking_s), _positive("mtbf_s", mtbf_s)
    if delta >= 2 * mtbf:
        return mtbf, "daly"
    young = math.sqrt(2 * delta * mtbf)
    ratio = delta / (2 * mtbf)
    daly = young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta
    if abs(daly - young) <= YOUNG_TOLERANCE * young:
        return young, "young"
    return daly, "daly"


def changed(
    previous: IntervalDecision | None, new: IntervalDecision, *, threshold: float = CHANGE_THRESHOLD
) -> bool:
    """Whether ``new`` is worth applying and recording as an event.

    True for the first decision, when the formula's inputs first become
    measured (leaving ``"initial"``), or when the step count moved by at least
    ``threshold`` (10 %) of the previous one.
    """
    if previous is None or (previous.formula == "initial") != (new.formula == "initial"):
        return True
    return abs(new.steps - previous.steps) >= threshold * previous.steps


class AutoIntervalPolicy:
    """Chooses the checkpoint interval from this job's own measurements.

    - δ: the median of the last ``window`` measured blocking times (robust to a
      first save that also pays for allocation and warm-up).
    - Step time: total seconds over total steps of the last ``window`` reports.
    - M: the prior counts as ``prior_weight`` pseudo-failures over
      ``prior_weight × prior_mtbf_s`` seconds, so M = (w·M₀ + T) / (w + f) after f
      failures in T seconds of training and checkpointing (the posterior-mean
      rate under a Gamma(w, w·M₀) prior). No failures yields M₀ + T, never ∞.
    - Clamps: at least ``min_steps`` (>= 1), at most ``max_steps`` and
      ``max_interval_s`` (bounds the work a failure can take however
      optimistic the prior is).

    ``observed_failures`` and ``observed_run_s`` seed the estimate when workers
    restart (e.g. from the job's ``worker_failed`` events).
    """

    def __init__(
        self,
        *,
        prior_mtbf_s: float,
        initial_steps: int,
        min_steps: int = 1,
        max_steps: int | None = None,
        max_interval_s: float | None = 3600.0,
        prior_weight: float = 1.0,
        window: int = 5,
        observed_failures: int = 0,
        observed_run_s: float = 0.0,
    ):
        self.prior_mtbf_s = _positive("prior_mtbf_s", prior_mtbf_s)
        self.prior_weight = _positive("prior_weight", prior_weight)
        if min_steps < 1 or initial_steps < 1 or (max_steps is not None and max_steps < min_steps):
            raise ValueError(
                "need 1 <= min_steps <= max_steps and initial_steps >= 1, got "
                f"min_steps={min_steps}, max_steps={max_steps}, "
                f"initial_steps={initial_steps}"
            )
        if max_interval_s is not None:
            _positive("max_interval_s", max_interval_s)
        if window < 1 or observed_failures < 0 or observed_run_s < 0:
            raise ValueError("window must be >= 1; observed_failures and observed_run_s >= 0")
        self.initial_steps, self.min_steps, self.max_steps = initial_steps, min_steps, max_steps
        self.max_interval_s = max_interval_s
        self.failures, self.run_s = observed_failures, float(observed_run_s)
        self._blocking: deque[float] = deque(maxlen=window)
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)

    def observe_checkpoint(self, blocking_s: float) -> None:
        """Record how long one checkpoint blocked training."""
        if not (math.isfinite(blocking_s) and blocking_s >= 0):
            raise ValueError(f"blocking_s must be >= 0, got {blocking_s!r}")
        self._blocking.append(float(blocking_s))
        self.run_s += blocking_s

    def observe_steps(self, n: int, seconds: float) -> None:
        """Record that ``n`` training steps took ``seconds`` in total."""
        if n < 1 or not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"need n >= 1 and seconds >= 0, got n={n}, seconds={seconds!r}")
        self._steps.append((n, float(seconds)))
        self.run_s += seconds

    @property
    def mtbf_s(self) -> float:
        """The current MTBF estimate: prior and observations combined."""
        w = self.prior_weight
        return (w * self.prior_mtbf_s + self.run_s) / (w + self.failures)

    @property
    def blocking_s(self) -> float | None:
        """The smoothed blocking cost δ, or None before the first checkpoint."""
        return max(statistics.median(self._blocking), MIN_BLOCKING_S) if self._blocking else None

    @property
    def step_s(self) -> float | None:
        """The recent mean step time, or None before any steps (or if they took no time)."""
        steps = sum(n for n, _ in self._steps)
        seconds = sum(s for _, s in self._steps)
        return seconds / steps if steps and seconds > 0 else None

    def decide(self) -> IntervalDecision:
        """The interval the current measurements call for (see :func:`changed`)."""
        delta, step_s, mtbf = self.blocking_s, self.step_s, self.mtbf_s
        source = (
            f"MTBF {mtbf:.0f} s from prior {self.prior_mtbf_s:.0f} s and "
            f"{self.failures} failure(s) in {self.run_s:.0f} s"
        )
        if delta is None or step_s is None:
            missing = "checkpoint blocking time" if delta is None else "step time"
            return IntervalDecision(
                seconds=self.initial_steps * (step_s or 0.0),
                steps=self.initial_steps,
                blocking_s=delta or 0.0,
                mtbf_s=mtbf,
                formula="initial",
                reason=f"no {missing} measured yet; every {self.initial_steps} steps",
            )
        seconds, formula = optimal_interval_s(blocking_s=delta, mtbf_s=mtbf)
        steps, clamp = self._to_steps(seconds, step_s)
        return IntervalDecision(
            seconds=seconds,
            steps=steps,
            blocking_s=delta,
            mtbf_s=mtbf,
            formula=formula,
            reason=(
                f"{formula}: τ = {seconds:.1f} s for δ = {delta:.3f} s; {source}; "
                f"{steps} steps of {step_s:.3f} s{clamp}"
            ),
        )

    def _to_steps(self, seconds: float, step_s: float) -> tuple[int, str]:
        """Whole steps (>= 1) for ``seconds`` of training, clamped; and a note when clamped."""
        wanted = max(1, round(seconds / step_s))
        capped = seconds if self.max_interval_s is None else min(seconds, self.max_interval_s)
        steps = max(self.min_steps, max(1, round(capped / step_s)))
        if self.max_steps is not None:
            steps = min(steps, self.max_steps)
        return steps, ("" if steps == wanted else f" (clamped from {wanted})")
