"""Which committed checkpoint `etrain export` takes: --step, the newest, or --best."""

from __future__ import annotations

import pytest

from service.cli.export import BEST, ExportRefused, pick_checkpoint

LISTED = [
    {"step": 2, "eval_loss": 3.0, "best": False},
    {"step": 4, "eval_loss": 2.0, "best": True},
    {"step": 6, "eval_loss": 2.5, "best": False},
]


def test_newest_by_default_a_step_when_asked_and_the_marked_one_with_best():
    assert pick_checkpoint(LISTED, job_id="j", step=None)["step"] == 6
    assert pick_checkpoint(LISTED, job_id="j", step=2)["step"] == 2
    assert pick_checkpoint(LISTED, job_id="j", step=BEST)["step"] == 4


def test_best_of_a_job_that_never_evaluated_says_what_to_do():
    plain = [{"step": 2}, {"step": 4}]
    with pytest.raises(ExportRefused, match=r"train\.eval_every_steps.*pass --step"):
        pick_checkpoint(plain, job_id="j", step=BEST)
    with pytest.raises(ExportRefused, match="available steps: 2, 4"):
        pick_checkpoint(plain, job_id="j", step=3)
