"""checkpoint.interval: auto — Young/Daly optimum, MTBF estimate, step conversion, hysteresis."""

from __future__ import annotations

import math

import pytest

from workers.checkpoint.interval import (
    AutoIntervalPolicy,
    IntervalDecision,
    changed,
    optimal_interval_s,
)

DAY = 86400.0


def test_young_for_a_small_blocking_cost():
    # √(2 · 10 · 86400) = √1 728 000 = 1314.534...; Daly's terms would move it by ~0.5 %.
    seconds, formula = optimal_interval_s(blocking_s=10, mtbf_s=DAY)
    assert formula == "young"
    assert seconds == pytest.approx(1314.534, abs=1e-3)


def test_daly_when_the_blocking_cost_is_not_small_against_the_mtbf():
    # δ = 600 s, M = 3600 s: δ/(2M) = 1/12. Expanding Daly's bracket by hand:
    # τ = √(2δM) + δ/3 + (δ/9)·√(δ/2M) − δ = 2078.461 − 400 + 66.667 · 0.288675 = 1697.706
    seconds, formula = optimal_interval_s(blocking_s=600, mtbf_s=3600)
    assert formula == "daly"
    assert seconds == pytest.approx(2078.461 - 400 + 19.245, abs=1e-2)
    assert seconds < math.sqrt(2 * 600 * 3600)  # the correction shortens Young's interval


@pytest.mark.parametrize(("blocking_s", "mtbf_s"), [(200, 100), (100, 50), (7200, 3600)])
def test_a_blocking_cost_of_two_mtbfs_or_more_checkpoints_every_mtbf(blocking_s, mtbf_s):
    assert optimal_interval_s(blocking_s=blocking_s, mtbf_s=mtbf_s) == (mtbf_s, "daly")


@pytest.mark.parametrize(
    "deltas", [[1, 2, 5, 10, 20], [100, 1000, 5000, 20000, 170000]], ids=["young", "daly"]
)
def test_a_costlier_checkpoint_means_a_longer_interval(deltas):
    taus = [optimal_interval_s(blocking_s=d, mtbf_s=DAY)[0] for d in deltas]
    assert taus == sorted(taus) and len(set(taus)) == len(taus)


def test_a_longer_mtbf_means_a_longer_interval():
    taus = [optimal_interval_s(blocking_s=10, mtbf_s=m)[0] for m in (60, 600, 3600, DAY, 1e7)]
    assert taus == sorted(taus) and len(set(taus)) == len(taus)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("name", ["blocking_s", "mtbf_s"])
def test_inputs_must_be_positive(name, bad):
    args = {"blocking_s": 10.0, "mtbf_s": DAY, name: bad}
    with pytest.raises(ValueError, match=name):
        optimal_interval_s(**args)


def _policy(**overrides) -> AutoIntervalPolicy:
    return AutoIntervalPolicy(**{"prior_mtbf_s": DAY, "initial_steps": 50, **overrides})


def test_before_measurements_the_initial_interval_applies():
    p = _policy()
    first = p.decide()
    assert (first.formula, first.steps, first.seconds) == ("initial", 50, 0.0)
    assert "checkpoint blocking time" in first.reason
    assert changed(None, first)
    p.observe_steps(10, 5.0)
    assert p.decide().formula == "initial" and p.decide().seconds == 25.0


def test_with_no_failures_the_prior_mtbf_is_used():
    p = _policy()
    p.observe_steps(100, 50.0)  # 0.5 s a step
    p.observe_checkpoint(10.0)
    d = p.decide()
    # No failures: M = prior + the 60 s observed (50 s of steps + 10 s blocked).
    assert d.mtbf_s == pytest.approx(DAY + 60)
    assert d.formula == "young"
    assert d.seconds == pytest.approx(math.sqrt(2 * 10 * 86460))  # 1314.99 s
    assert d.steps == round(1314.99 / 0.5)  # 2630
    assert d.blocking_s == 10.0
    assert changed(_policy().decide(), d)  # leaving "initial" is always recorded


def test_observed_failures_shrink_the_mtbf_and_shorten_the_interval():
    def measured(**kwargs):
        p = _policy(**kwargs)
        p.observe_steps(100, 50.0)
        p.observe_checkpoint(10.0)
        return p.decide()

    # A restored run starts with the failures its predecessors saw (the manifest keeps them).
    before, after = measured(), measured(observed_failures=1)
    # The prior is one pseudo-failure: M = (86400 + 60) / (1 + 1) = 43230 s.
    assert after.mtbf_s == pytest.approx(43230.0)
    assert after.seconds == pytest.approx(math.sqrt(2 * 10 * 43230))  # 929.84 s
    assert after.steps == 1860 < before.steps
    assert changed(before, after)


def test_seeded_history_counts_like_observations():
    p = _policy(observed_failures=3, observed_run_s=3600.0)
    assert p.mtbf_s == pytest.approx((DAY + 3600) / 4)


def test_blocking_cost_is_the_median_of_recent_checkpoints():
    p = _policy(window=3)
    for blocking in (30.0, 10.0, 12.0, 11.0):  # the first (warm-up) one leaves the window
        p.observe_checkpoint(blocking)
    assert p.blocking_s == 11.0
    p.observe_checkpoint(500.0)  # one slow save does not move the median
    assert p.blocking_s == 12.0


@pytest.mark.parametrize(
    ("overrides", "steps", "clamped"),
    [
        ({}, 657, False),  # 1314.76 s / 2 s
        ({"max_steps": 100}, 100, True),
        ({"min_steps": 1000}, 1000, True),
        ({"max_interval_s": 60.0}, 30, True),
    ],
)
def test_seconds_become_whole_clamped_steps(overrides, steps, clamped):
    p = _policy(**{"max_interval_s": None, **overrides})
    p.observe_steps(10, 20.0)  # 2 s a step
    p.observe_checkpoint(10.0)
    d = p.decide()
    # M = 86400 + 30 s observed; τ = √(2 · 10 · 86430) = √1 728 600 = 1314.762 s
    assert d.seconds == pytest.approx(1314.762, abs=1e-3)
    assert d.steps == steps
    assert ("clamped" in d.reason) is clamped


def test_an_interval_shorter_than_one_step_is_one_step():
    p = _policy(prior_mtbf_s=60.0)
    p.observe_steps(1, 600.0)  # very slow steps, frequent failures
    p.observe_checkpoint(0.5)
    assert p.decide().steps == 1


@pytest.mark.parametrize(
    ("new_steps", "expected"), [(109, False), (110, True), (91, False), (90, True), (100, False)]
)
def test_only_changes_of_ten_percent_are_worth_an_event(new_steps, expected):
    def decision(steps):
        return IntervalDecision(
            seconds=steps * 0.5, steps=steps, blocking_s=1.0, mtbf_s=DAY, formula="young", reason=""
        )

    assert changed(decision(100), decision(new_steps)) is expected


def test_event_data_is_plain_json():
    d = IntervalDecision(
        seconds=1314.5341, steps=2629, blocking_s=10.0, mtbf_s=DAY, formula="young", reason="r"
    )
    assert d.as_event_data() == {
        "seconds": 1314.534,
        "steps": 2629,
        "blocking_s": 10.0,
        "mtbf_s": 86400.0,
        "formula": "young",
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_steps": 0},
        {"initial_steps": 0},
        {"min_steps": 5, "max_steps": 4},
        {"prior_mtbf_s": 0},
        {"max_interval_s": -1.0},
        {"window": 0},
    ],
)
def test_policy_settings_are_validated(kwargs):
    with pytest.raises(ValueError):
        _policy(**kwargs)


def test_observations_are_validated():
    p = _policy()
    with pytest.raises(ValueError):
        p.observe_steps(0, 1.0)
    with pytest.raises(ValueError):
        p.observe_checkpoint(-1.0)
