"""Held-out evaluation in the training loop, in one plain process (no process group)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from tests.support.eval_reference import evaluate_checkpoint
from tests.support.recording import RecordingReporter
from workers.build import stores_of
from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.retention import best_steps, retained_steps
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, _dataset, _datasets, run, spec_model_config


def spec(data=None, *, steps=6, **train) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "unit",
            "data": {"seq_len": 16, "num_samples": 64, **(data or {})},
            "resources": {"workers": 1},
            "train": {
                "steps": steps,
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "lr": 1e-2,
                **train,
            },
            "checkpoint": {"every_steps": 2, "keep_last": 20},
        }
    )


def env(root=None, reporter=None) -> RunEnv:
    return RunEnv(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=locate(str(root)) if root else None,
        reporter=reporter,
        measure_memory=False,
    )


HELD_OUT = {"eval_fraction": 0.25}
SOURCE = {"eval": {"source": "synthetic", "num_samples": 5}}


def test_evaluates_every_n_steps_and_after_the_last_the_weights_it_saved(tmp_path):
    job = spec(HELD_OUT, eval_every_steps=4, eval_samples=7)
    reporter = RecordingReporter()
    result = run(job, env(tmp_path, reporter))
    assert sorted(result.eval_losses) == [4, 6]
    for step, loss in result.eval_losses.items():
        # The same set, the same weights (the checkpoint the step committed), one process.
        assert loss == pytest.approx(evaluate_checkpoint(job, tmp_path, step), rel=1e-12)
    assert result.eval_losses[6] < result.eval_losses[4] < math.log(job_vocab(job))
    points = {p.step: p for p in reporter.metrics}
    for step, point in points.items():
        fields = point.model_dump()
        if step in result.eval_losses:
            assert fields["eval_loss"] == result.eval_losses[step]
            assert fields["eval_perplexity"] == pytest.approx(math.exp(fields["eval_loss"]))
            assert fields["eval_samples"] == 7 and fields["eval_s"] > 0
        else:
            assert not {"eval_loss", "eval_perplexity", "eval_s"} & set(fields)
        # The held-out samples are not trained on: the epoch is the rest.
        assert fields["epoch_size"] == 64 - 16


def job_vocab(job: JobSpec) -> int:
    return spec_model_config(job, stores_of(job)).vocab_size


def test_an_evaluation_source_leaves_training_bit_for_bit_as_it_was():
    plain = run(spec(), env())
    evaluated = run(spec(SOURCE, eval_every_steps=2), env())
    assert evaluated.losses == plain.losses
    assert sorted(evaluated.eval_losses) == [2, 4, 6]
    assert plain.eval_losses == {}


def test_a_synthetic_evaluation_source_is_the_chain_after_the_training_samples():
    job = spec(SOURCE)
    cfg = spec_model_config(job, stores_of(job))
    train, evaluation = _datasets(job, cfg)
    assert len(train) == 64 and evaluation.size == 5 and evaluation.count == 5 * 16
    longer = _dataset(
        job.model_copy(update={"data": job.data.model_copy(update={"num_samples": 69})}), cfg
    )
    for i in range(5):
        assert torch.equal(evaluation.dataset[i], longer[64 + i])
    assert not any(torch.equal(evaluation.dataset[0], train[i]) for i in range(64))


def test_a_resumed_run_evaluates_the_same_set_to_the_same_loss(tmp_path):
    job = spec(HELD_OUT, eval_every_steps=2)
    full = run(job, env(tmp_path / "a"))
    run(job, env(tmp_path / "b"))
    shutil.rmtree(tmp_path / "b" / "step_00000006")  # as if killed after step 5
    resumed = run(job, env(tmp_path / "b"))
    assert resumed.resumed_from == 4
    assert resumed.eval_losses == {6: full.eval_losses[6]}


def test_a_stop_before_the_last_step_evaluates_only_on_the_interval():
    result = run(spec(HELD_OUT, eval_every_steps=4), RunEnv(0, 1, torch.device("cpu"), stop_at=5))
    assert sorted(result.eval_losses) == [4]


def test_the_retention_rule_keeps_the_k_lowest_held_out_losses_too():
    losses = {2: 3.0, 4: 1.0, 6: 2.0, 8: 1.0, 10: 5.0}
    assert best_steps(losses, losses, 2) == [4, 8]  # a tie keeps the earlier step first
    assert best_steps([2, 4, 5], {2: 3.0, 4: 1.0}, 5) == [4, 2]  # step 5 never evaluated
    assert retained_steps(losses, keep_last=1, keep_best=2, losses=losses) == {4, 8, 10}
    assert retained_steps(losses, keep_last=1, keep_best=1, losses=losses) == {4, 10}
    assert retained_steps(losses, keep_last=2, losses=losses) == {8, 10}


def test_keep_best_keeps_exactly_the_k_lowest_evaluated_checkpoints(tmp_path):
    reporter = RecordingReporter()
    job = spec(HELD_OUT, eval_every_steps=1, steps=8, lr=1.0, optimizer="sgd")
    job = job.model_copy(
        update={
            "checkpoint": job.checkpoint.model_copy(
                update={"every_steps": 1, "keep_last": 1, "keep_best": 2}
            )
        }
    )
    result = run(job, env(tmp_path, reporter))
    losses = result.eval_losses
    assert sorted(losses) == list(range(1, 9))
    best = sorted(losses, key=lambda s: (losses[s], s))[:2]
    assert 8 not in best, "the test needs a best that is not the newest"
    kept = {c.step for c in CheckpointManager(tmp_path, keep_last=None, rank=0).committed()}
    assert kept == set(best) | {8}
    # Each checkpoint record says the loss its ranking used.
    recorded = {c.step: c.eval_loss for c in reporter.checkpoints}
    assert recorded == losses


def expected_stop(losses: dict[int, float], patience: int, min_delta: float) -> int | None:
    best, bad = None, 0
    for step in sorted(losses):
        if best is None or losses[step] < best - min_delta:
            best, bad = losses[step], 0
        else:
            bad += 1
        if bad >= patience:
            return step
    return None


STOPPING = {"patience": 2, "min_delta": 0.05}


def test_early_stopping_ends_the_run_where_the_rule_says_with_a_checkpoint_and_an_event(tmp_path):
    full = run(spec(HELD_OUT, eval_every_steps=1, steps=12), env())
    want = expected_stop(full.eval_losses, **STOPPING)
    assert want is not None and want < 12, full.eval_losses
    reporter = RecordingReporter()
    job = spec(HELD_OUT, eval_every_steps=1, steps=12, early_stopping=STOPPING)
    result = run(job, env(tmp_path, reporter))
    assert result.stopped_early == want and max(result.losses) == want
    assert result.eval_losses == {s: v for s, v in full.eval_losses.items() if s <= want}
    assert (
        max(c.step for c in CheckpointManager(tmp_path, keep_last=None, rank=0).committed()) == want
    )
    (stopped,) = [e for e in reporter.events if e.kind == "early_stopped"]
    assert stopped.data["step"] == want and f"step {want}" in stopped.message


def test_early_stopping_counts_on_after_a_resume(tmp_path):
    job = spec(HELD_OUT, eval_every_steps=1, steps=12, early_stopping=STOPPING)
    full = run(job, env(tmp_path / "a"))
    stop = full.stopped_early
    run(
        job,
        RunEnv(
            0, 1, torch.device("cpu"), checkpoints=locate(str(tmp_path / "b")), stop_at=stop - 1
        ),
    )
    resumed = run(job, env(tmp_path / "b"))
    assert resumed.resumed_from is not None and resumed.stopped_early == stop
