"""TensorBoard event files (workers.telemetry.tensorboard) without a training run: the
copies a store gets (a store that refuses is tried again at the next copy), files begun
anew past their size, a restarted run's points replacing the lost run's, resize markers.
Read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import json
import logging
import os

import pytest
from tensorboard.backend.event_processing import event_accumulator

from workers.contract import EventKind, MetricPoint
from workers.storage.confine import ROOTS_ENV
from workers.storage.location import locate, resolve_storage
from workers.telemetry import tensorboard as tb
from workers.telemetry.sink import Off


def _read(folder) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _losses(acc) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars("train/loss")}


def _point(step: int, loss: float, world_size: int = 2) -> MetricPoint:
    return MetricPoint(step=step, world_size=world_size, loss=loss, grad_norm=loss / 2, ts=1e9)


def test_a_store_that_refuses_gets_the_files_at_the_next_copy(tmp_path, caplog):
    spool, remote = tmp_path / "spool", tmp_path / "store" / "tensorboard"
    files = tb.EventFiles(str(spool))
    log = tb.TensorBoardLog(
        files, upload=tb.Upload(resolve_storage(f"file://{remote}"), str(spool))
    )
    remote.parent.mkdir()
    remote.write_text("a file where the folder should be")  # every copy fails
    for step in (1, 2, 3):
        log.put(("metric", step, _point(step, float(step))))
    with caplog.at_level(logging.WARNING, logger=tb.__name__):
        assert not log.upload.sync(current=files.suffix)
    assert f"copying event files to file://{remote} failed" in caplog.text
    remote.unlink()
    log.close()  # the final copy goes through
    assert _losses(_read(remote)) == {1: 1.0, 2: 2.0, 3: 3.0}
    assert not spool.exists()  # everything is in the store: the spool is gone


def test_files_are_begun_anew_past_their_size_and_read_back_in_order(tmp_path, monkeypatch):
    spool, remote = tmp_path / "spool", tmp_path / "store"
    upload = tb.Upload(resolve_storage(f"file://{remote}"), str(spool))
    log = tb.TensorBoardLog(tb.EventFiles(str(spool), rotate_bytes=2048), upload=upload)
    for step in range(1, 101):
        log.put(("metric", step, _point(step, step / 10)))
    log.close()
    names = sorted(os.listdir(remote))
    assert len(names) > 3, names  # 100 points of ~60 bytes, 2 KiB per file
    assert _losses(_read(remote)) == pytest.approx({s: s / 10 for s in range(1, 101)})
    assert [e.value for e in _read(remote).Scalars("train/grad_norm")][:2] == pytest.approx(
        [0.05, 0.1]
    )


def test_done_files_leave_the_spool_once_copied(tmp_path):
    spool, remote = tmp_path / "spool", tmp_path / "store"
    files = tb.EventFiles(str(spool), rotate_bytes=512)
    upload = tb.Upload(resolve_storage(f"file://{remote}"), str(spool))
    for step in range(1, 40):
        files.write(_event(step))
    files.flush()
    assert upload.sync(current=files.suffix)
    assert [n for n in os.listdir(spool)] == [
        n for n in os.listdir(spool) if n.endswith(files.suffix)
    ]
    assert len(os.listdir(remote)) == files.count
    files.close()


def _event(step: int):
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    value = Summary.Value(tag="train/loss", simple_value=float(step))
    return Event(wall_time=1e9, step=step, summary=Summary(value=[value]))


def test_a_restarted_runs_points_replace_the_lost_runs(tmp_path):
    """The lost run wrote steps 1..6 (checkpoint at 3); the restart from 3 writes 4..6
    again: TensorBoard shows 1..3 of the first run and 4..6 of the second, and the
    restore, which changed the group size, is marked at step 3 as restored and resized."""
    folder = tmp_path / "tensorboard"
    first = tb.TensorBoardLog(tb.EventFiles(str(folder)), start=0)
    for step in range(1, 7):
        first.put(("metric", step, _point(step, 10.0 + step)))
    first.close()
    second = tb.TensorBoardLog(tb.EventFiles(str(folder)), start=3)
    tee = tb.TensorBoardTee(None, second, step=3)
    data = {"step": 3, "world_size": 1, "saved_world_size": 2}
    tee.event(EventKind.RESTORED, "restored from step 3 (saved by 2 workers, now 1)", data=data)
    for step in range(4, 7):
        tee.metric(_point(step, 20.0 + step, world_size=1))
    tee.close()
    acc = _read(folder)
    assert _losses(acc) == {1: 11.0, 2: 12.0, 3: 13.0, 4: 24.0, 5: 25.0, 6: 26.0}
    assert [e.value for e in acc.Scalars("train/world_size")] == [2.0] * 3 + [1.0] * 3
    assert [e.step for e in acc.Scalars("events/restored")] == [3]
    assert [e.step for e in acc.Scalars("events/resized")] == [3]
    text = acc.Tensors("events/resized/text_summary")[0].tensor_proto.string_val[0]
    assert b"saved by 2 workers, now 1" in text


def test_a_folder_it_may_not_make_leaves_the_run_without_event_files(caplog, tmp_path, monkeypatch):
    """The job's checkpoints outside its write roots (a link swapped in, say): the run
    goes on, without curves, and says why."""
    allowed = tmp_path / "mine"
    monkeypatch.setenv(ROOTS_ENV, json.dumps({"read": [], "write": [str(allowed)]}))

    class Env:
        rank, checkpoints, reporter = 0, locate(tmp_path / "other" / "checkpoints"), None

    with caplog.at_level(logging.WARNING, logger=tb.__name__):
        env, closer = tb.with_tensorboard(True, Env(), start=0)
    assert env.reporter is None and isinstance(closer, Off)
    assert "no event files for this run (ConfinementError:" in caplog.text
    assert not (tmp_path / "other").exists()


def test_a_checkpoints_flush_returns_once_the_store_holds_the_steps(tmp_path):
    """Before a checkpoint commits the loop flushes its reporter: the tee's flush returns
    once the copies in the store hold every step queued before it."""
    spool, remote = tmp_path / "spool", tmp_path / "store"
    upload = tb.Upload(resolve_storage(f"file://{remote}"), str(spool))
    tee = tb.TensorBoardTee(
        None, tb.TensorBoardLog(tb.EventFiles(str(spool)), upload=upload), step=0
    )
    for step in (1, 2, 3, 4):
        tee.metric(_point(step, float(step)))
    assert tee.flush(timeout=30.0)
    assert _losses(_read(remote)) == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    tee.close()


def test_the_steps_that_evaluate_also_get_eval_scalars(tmp_path):
    """eval/loss and eval/perplexity at the steps whose point has them (an overflowed
    perplexity is left out); train/* at every step as before."""
    folder = tmp_path / "tensorboard"
    tee = tb.TensorBoardTee(None, tb.TensorBoardLog(tb.EventFiles(str(folder))), step=0)
    evals = {3: {"eval_loss": 3.5, "eval_perplexity": 33.12}, 6: {"eval_loss": 3.25}}
    for step in range(1, 8):
        extra = {**evals[step], "eval_s": 0.5, "eval_samples": 16} if step in evals else {}
        tee.metric(MetricPoint(step=step, world_size=2, loss=10.0 - step, ts=1e9, **extra))
    tee.close()
    acc = _read(folder)
    assert _losses(acc) == {s: 10.0 - s for s in range(1, 8)}
    assert {e.step: e.value for e in acc.Scalars("eval/loss")} == {
        s: pytest.approx(e["eval_loss"]) for s, e in evals.items()
    }
    assert {e.step: e.value for e in acc.Scalars("eval/perplexity")} == {
        3: pytest.approx(evals[3]["eval_perplexity"])
    }
    assert {t for t in acc.Tags()["scalars"] if t.startswith("eval/")} == {
        "eval/loss",
        "eval/perplexity",
    }
