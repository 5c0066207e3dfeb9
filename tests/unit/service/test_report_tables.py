"""`etrain report`'s pure parts: the maths of its tables, the variant specs, the PNGs and
report.md."""

from __future__ import annotations

import math

import matplotlib.image
import pytest

from service.reports import markdown, plots, tables, variants
from service.reports.tables import Throughput

BASE_SPEC = {
    "name": "tiny",
    "model": {"preset": "gpt-tiny"},
    "parallelism": {"strategy": "ddp", "dp": 2},
    "resources": {"workers": {"min": 1, "max": 2}},
    "train": {"steps": 10, "warmup_steps": 5, "global_batch_size": 8, "micro_batch_size": 2},
}


def point(step: int, tps: float, step_s: float = 0.5, **extra) -> dict:
    return {
        "step": step,
        "tokens_per_s": tps,
        "samples_per_s": tps / 32,
        "step_time_s": step_s,
        "ts": f"2026-12-01T00:00:{step:02d}Z",
        **extra,
    }


def test_throughput_leaves_out_warmup_and_weighs_steps_by_time():
    # Warm-up steps are 100x slower: were they counted, the result would be far lower.
    points = [point(1, 10, 5.0), point(2, 10, 5.0), point(3, 1000, 1.0), point(4, 2000, 0.5)]
    speed = tables.throughput(points, warmup=2)
    assert speed.steps == 2
    # 1000 + 1000 tokens over 1.5 s, not the mean of the rates (1500).
    assert speed.tokens_per_s == pytest.approx(2000 / 1.5)
    assert speed.samples_per_s == pytest.approx(2000 / 1.5 / 32)
    assert speed.step_time_s == pytest.approx(0.75)


def test_throughput_keeps_the_newest_point_of_a_repeated_step_and_refuses_nothing_left():
    points = [point(1, 10), point(2, 100), point(2, 300), point(3, 300)]
    assert tables.throughput(points, warmup=1).tokens_per_s == pytest.approx(300)
    with pytest.raises(ValueError, match="after the first 3"):
        tables.throughput(points, warmup=3)


def test_scaling_speedup_is_one_at_the_base_and_efficiency_is_speedup_over_ideal():
    speed = {n: Throughput(tps, tps / 32, 1.0, 5) for n, tps in ((4, 3000.0), (1, 1000.0))}
    rows = tables.scaling_rows([(4, speed[4], "j-4"), (1, speed[1], "j-1")])
    assert [r.workers for r in rows] == [1, 4]
    assert rows[0].speedup == 1.0 and rows[0].efficiency == 1.0 and rows[0].ideal == 1.0
    assert rows[1].speedup == pytest.approx(3.0)
    assert rows[1].ideal == 4.0 and rows[1].efficiency == pytest.approx(0.75)
    table = tables.scaling_table(rows)
    assert table.rows[0][:1] == ("1",) and table.rows[0][4:7] == ("1.000", "1.000", "1.000")
    assert table.rows[1][4:7] == ("3.000", "4.000", "0.750") and table.rows[1][-1] == "j-4"


def test_scaling_base_is_the_smallest_size_given():
    rows = tables.scaling_rows(
        [(2, Throughput(100.0, 1, 1, 1), "a"), (8, Throughput(300.0, 1, 1, 1), "b")]
    )
    assert rows[0].speedup == 1.0 and rows[1].ideal == 4.0
    assert rows[1].efficiency == pytest.approx(0.75)


def test_memory_rows_per_component():
    ranks = [
        {"params_bytes": 10, "grads_bytes": 10, "optimizer_bytes": 20, "activations_bytes": 5},
        {
            "params_bytes": 12,
            "grads_bytes": 12,
            "optimizer_bytes": 24,
            "activations_bytes": 5,
            "gathered_params_bytes": 7,
            "reference_bytes": 3,  # a frozen part (counted in the plan's buffers)
        },
    ]
    measured = tables.measured_row("zero3", ranks)
    assert measured.parts == {"params": 12, "grads": 12, "optimizer": 24, "activations": 5}
    assert measured.other == 10 and measured.state == 48 and measured.total == 63
    assert tables.measured_row("ddp", []) is None
    plan = {
        "per_rank": {
            "params_bytes": 2**20,
            "grads_bytes": 2**20,
            "optimizer_bytes": 2**21,
            "activations_bytes": 2**19,
            "buffers_bytes": 2**18,
            "total_bytes": 0,
        },
        "breakdown": {"host_bytes": 3 * 2**20},
    }
    predicted = tables.predicted_row("zero3", plan)
    assert predicted.state == 2**22 and predicted.host == 3 * 2**20
    table = tables.memory_table([measured, predicted])
    assert table.headers[:6] == (
        "strategy",
        "source",
        "params",
        "grads",
        "optimizer",
        "activations",
    )
    assert table.rows[1] == (
        "zero3",
        "predicted",
        "1.00",
        "1.00",
        "2.00",
        "0.50",
        "0.25",
        "4.00",
        "4.75",
        "3.00",
    )
    assert table.rows[0][-1] == "-"  # no host figure for what the workers measured


def test_accumulation_rows_relative_to_the_first():
    rows = tables.accumulation_rows(
        [(1, 4, Throughput(100.0, 3, 1, 2), "a"), (4, 1, Throughput(250.0, 8, 1, 2), "b")]
    )
    assert [(r.micro, r.accumulation, r.relative) for r in rows] == [(1, 4, 1.0), (4, 1, 2.5)]
    assert tables.accumulation_table(rows).rows[1][:2] == ("4", "1")


def test_markers_take_the_event_step_or_the_next_step_that_ended():
    points = [point(s, 100) for s in range(1, 6)]
    events = [
        {"kind": "submitted", "ts": "2026-12-01T00:00:00Z", "data": None},
        {"kind": "checkpoint_saved", "ts": "2026-12-01T00:00:04Z", "data": {"step": 2}},
        {"kind": "worker_failed", "ts": "2026-12-01T00:00:02.5Z", "data": {}},
        {"kind": "resized", "ts": "2026-12-01T00:09:00Z"},
    ]
    assert tables.markers(events, points) == [
        (2, "checkpoint_saved"),
        (3, "worker_failed"),
        (5, "resized"),  # after the last step: drawn at the last one
    ]


def test_goodput_parts_and_job_table():
    goodput = {
        "wall_s": 10.0,
        "productive_s": 6.0,
        "goodput": 0.6,
        "breakdown": {"startup_s": 3.0, "checkpoint_blocking_s": 1.0, "eval_s": 0.5},
    }
    assert tables.goodput_parts(goodput) == [
        ("productive", 6.0),
        ("startup", 3.0),
        ("checkpoint blocking", 1.0),
        ("eval", 0.5),
    ]
    points = [point(1, 100, loss=5.0), point(2, 300, loss=4.0)]
    rows = dict(tables.job_table({"id": "j-1", "status": "SUCCEEDED"}, points, goodput).rows)
    assert rows["first loss"] == "5.0000" and rows["final loss"] == "4.0000"
    assert rows["mean tokens/s"] == "200.0" and rows["goodput"] == "0.600"
    assert rows["startup s"] == "3.00" and rows["steps"] == "2"
    assert "final eval loss" not in rows  # it never evaluated
    points += [point(3, 300, loss=3.9, eval_loss=4.25), point(4, 300, loss=3.8)]
    rows = dict(tables.job_table({"id": "j-1"}, points, goodput).rows)
    assert rows["final eval loss"] == "4.2500 at step 3" and rows["final loss"] == "3.8000"
    assert tables.series(points, "eval_loss") == ([3], [4.25])
    assert "final reward accuracy" not in rows  # not a DPO job
    dpo = [point(1, 100, loss=0.69, rewards_accuracy=0.5, rewards_margin=0.0)]
    dpo.append(point(2, 100, loss=0.6, rewards_accuracy=0.875, rewards_margin=0.25))
    rows = dict(tables.job_table({"id": "j-2"}, dpo, goodput).rows)
    assert (rows["final reward accuracy"], rows["final reward margin"]) == ("0.8750", "0.2500")


def test_scaling_variants_fix_the_size_and_keep_the_global_batch():
    specs = variants.scaling_specs(BASE_SPEC, [1, 2], steps=4)
    assert [n for n, _ in specs] == [1, 2]
    one, two = specs[0][1], specs[1][1]
    assert one["name"] == "report-scaling-w1" and two["name"] == "report-scaling-w2"
    assert one["resources"]["workers"] == 1 and "dp" not in one["parallelism"]
    assert one["train"]["global_batch_size"] == two["train"]["global_batch_size"] == 8
    assert one["train"]["steps"] == 4 and one["train"]["warmup_steps"] == 3  # < steps
    assert BASE_SPEC["resources"]["workers"] == {"min": 1, "max": 2}  # the input is untouched


def test_memory_variants_are_the_four_strategies():
    specs = dict(variants.memory_specs(BASE_SPEC, steps=2))
    assert list(specs) == ["ddp", "zero2", "zero3", "zero3-offload"]
    assert specs["ddp"]["parallelism"] == {"strategy": "ddp"}
    assert specs["zero2"]["parallelism"]["fsdp"]["zero_stage"] == 2
    assert specs["zero3-offload"]["parallelism"]["fsdp"] == {"zero_stage": 3, "cpu_offload": True}
    assert specs["zero3-offload"]["name"] == "report-memory-zero3-offload"


def test_accumulation_variants_follow_the_micro_batch():
    spec = {**BASE_SPEC, "parallelism": {"strategy": "ddp"}, "resources": {"workers": 2}}
    got = [
        (m, variants.accumulation_steps(s, 2), s["train"]["micro_batch_size"])
        for m, s in variants.accumulation_specs(spec, [1, 2, 4])
    ]
    assert got == [(1, 4, 1), (2, 2, 2), (4, 1, 4)]
    ((_, three),) = variants.accumulation_specs(spec, [3])
    with pytest.raises(ValueError, match="--micro 3 x data-parallel degree 2"):
        variants.accumulation_steps(three, 2)
    with pytest.raises(ValueError, match="train must be a mapping"):
        variants.variant({"train": [1]}, "scaling", "w1", steps=3)


def _read_png(path):
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (plots.PIXELS[1], plots.PIXELS[0])
    assert not math.isclose(float(image.std()), 0.0)  # not a blank canvas
    return image


def test_every_plot_writes_a_readable_png_of_the_expected_size(tmp_path):
    speed = Throughput(1000.0, 30.0, 0.1, 5)
    scaling = tables.scaling_rows([(1, speed, "a"), (2, Throughput(1800.0, 55, 0.05, 5), "b")])
    mem = [
        tables.MemoryRow(s, src, dict.fromkeys(tables.COMPONENTS, 2**20 * (i + 1)), 2**19)
        for i, s in enumerate(("ddp", "zero3"))
        for src in ("measured", "predicted")
    ]
    accum = tables.accumulation_rows([(1, 4, speed, "a"), (2, 2, speed, "b")])
    marks = [(2, "checkpoint_saved"), (3, "restored")]
    written = [
        plots.scaling_png(scaling, tmp_path / "scaling.png"),
        plots.memory_png(mem, tmp_path / "memory.png"),
        plots.accumulation_png(accum, tmp_path / "accumulation.png"),
        plots.curves_png({"loss": ([1, 2, 3, 4], [5.0, 4.0, 3.5, 3.0])}, marks, tmp_path / "l.png"),
        plots.goodput_png([("productive", 6.0), ("startup", 4.0)], 0.6, tmp_path / "g.png"),
    ]
    for path in written:
        assert path.stat().st_size > 5000
        _read_png(path)


def test_report_md_embeds_the_images_and_the_table(tmp_path):
    table = tables.Table("scaling", ("workers", "note"), [("1", "a|b")])
    image = tmp_path / "scaling.png"
    path = markdown.write_report(tmp_path, "Scaling", ["intro line"], [table], [image])
    text = path.read_text()
    assert text.startswith("# Scaling\n\nintro line")
    assert "| workers | note |\n|---|---|\n| 1 | a\\|b |" in text
    assert "![scaling](scaling.png)" in text
    assert str(markdown.default_out("memory")).startswith("etrain-report-memory-")
