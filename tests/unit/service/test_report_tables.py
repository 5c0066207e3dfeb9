"""`etrain report`'s pure parts: the maths of its tables, the variant specs, the PNGs and
report.md."""

from __future__ import annotations

import math
import re

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
    assert measured.buckets == 0
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
    assert table.headers[6:] == ("buckets", "other", "state", "total", "host")
    assert table.rows[1] == (
        "zero3",
        "predicted",
        "1.00",
        "1.00",
        "2.00",
        "0.50",
        "-",  # the plan counts reduce buckets among its buffers
        "0.25",
        "4.00",
        "4.75",
        "3.00",
    )
    assert table.rows[0][-1] == "-"  # no host figure for what the workers measured


def test_deepspeed_reduce_buckets_are_measured_apart_and_counted_in_the_total():
    mib = 2**20
    rank = {
        "params_bytes": 3 * mib,
        "grads_bytes": mib,
        "optimizer_bytes": 6 * mib,
        "activations_bytes": mib,
        "buckets_bytes": 8 * mib,  # larger than the rest: not what picks the rank
        "gathered_params_bytes": mib,
    }
    row = tables.measured_row("ds-zero3", [rank, {**rank, "buckets_bytes": 0, "grads_bytes": 0}])
    assert row.buckets == 8 * mib and row.other == mib and row.state == 10 * mib
    assert row.total == 20 * mib
    (cells,) = tables.memory_table([row]).rows
    assert cells[6:10] == ("8.00", "1.00", "10.00", "20.00")


def test_peak_is_the_highest_rank_and_unknown_without_one():
    ranks = [{"peak_bytes": 5}, {"peak_bytes": 9}, "not a rank", {"params_bytes": 100}]
    assert tables.peak_bytes(ranks) == 9
    assert tables.peak_bytes([{"params_bytes": 1}]) is None and tables.peak_bytes([]) is None


def test_compare_rows_relative_to_the_first_strategy_given():
    fsdp, ds = Throughput(400.0, 12.5, 0.08, 3), Throughput(300.0, 9.4, 0.1066, 3)
    rows = tables.compare_rows(
        [("zero3", fsdp, 3 * 2**20, 2**21, "j-1"), ("ds-zero3", ds, None, 2**22, "j-2")]
    )
    assert [(r.strategy, r.relative) for r in rows] == [("zero3", 1.0), ("ds-zero3", 0.75)]
    table = tables.compare_table(rows)
    got = [dict(zip(table.headers, row, strict=True)) for row in table.rows]
    assert got == [
        {
            "strategy": "zero3",
            "job": "j-1",
            "tokens/s": "400.0",
            "step ms": "80.0",
            "relative": "1.000",
            "peak MiB": "3.00",
            "predicted MiB": "2.00",
        },
        {
            "strategy": "ds-zero3",
            "job": "j-2",
            "tokens/s": "300.0",
            "step ms": "106.6",
            "relative": "0.750",
            "peak MiB": "-",  # no rank reported a peak
            "predicted MiB": "4.00",
        },
    ]
    assert tables.compare_rows([]) == []


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


def test_memory_variants_are_every_zero_stage_of_fsdp_and_deepspeed():
    specs = dict(variants.memory_specs(BASE_SPEC, steps=2))
    assert list(specs) == [
        "ddp",
        "zero2",
        "zero3",
        "zero3-offload",
        "ds-zero0",
        "ds-zero1",
        "ds-zero2",
        "ds-zero3",
        "ds-zero3-offload",
    ]
    assert specs["ddp"]["parallelism"] == {"strategy": "ddp"}
    assert specs["zero2"]["parallelism"]["fsdp"]["zero_stage"] == 2
    assert specs["zero3-offload"]["parallelism"]["fsdp"] == {"zero_stage": 3, "cpu_offload": True}
    assert specs["zero3-offload"]["name"] == "report-memory-zero3-offload"
    for stage in range(4):
        assert specs[f"ds-zero{stage}"]["parallelism"] == {
            "strategy": "deepspeed",
            "deepspeed": {"zero_stage": stage},
        }
    offload = specs["ds-zero3-offload"]["parallelism"]["deepspeed"]
    assert offload == {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}
    assert specs["ds-zero3"]["name"] == "report-memory-ds-zero3"


def test_deepspeed_variants_keep_the_specs_tuning_and_set_their_stage():
    config = {"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto", "overlap_comm": True}}
    config["zero_optimization"]["stage3_max_live_parameters"] = 1000
    own = {
        "zero_stage": 2,
        "offload_optimizer": "cpu",
        "reduce_bucket_size": 5_000_000,
        "config": config,
    }
    spec = {**BASE_SPEC, "parallelism": {"strategy": "deepspeed", "deepspeed": own}}
    specs = dict(variants.memory_specs(spec, strategies=["ds-zero1", "ds-zero3", "zero3"]))
    tuned = {"reduce_bucket_size": 5_000_000, "stage3_max_live_parameters": 1000}
    # Below stage 2 overlap_comm is left out (the server refuses it there).
    assert specs["ds-zero1"]["parallelism"]["deepspeed"] == {"zero_stage": 1, **tuned}
    assert specs["ds-zero3"]["parallelism"]["deepspeed"] == {
        "zero_stage": 3,
        "overlap_comm": True,
        **tuned,
    }
    assert "deepspeed" not in specs["zero3"]["parallelism"]  # FSDP has no DeepSpeed section
    assert own["zero_stage"] == 2 and "config" in own  # the input is untouched
    assert variants.deepspeed_tuning({"parallelism": "ddp"}, 3) == {}
    assert variants.deepspeed_tuning({"parallelism": {"deepspeed": None}}, 3) == {}


def test_compare_variants_are_named_for_it_and_need_two_distinct_known_strategies():
    specs = variants.memory_specs(
        BASE_SPEC, kind="compare", strategies=["ds-zero3", "zero3"], at_least=2
    )
    assert [(n, s["name"]) for n, s in specs] == [
        ("ds-zero3", "report-compare-ds-zero3"),
        ("zero3", "report-compare-zero3"),
    ]
    choices = "choose from ddp, zero2, zero3, zero3-offload, ds-zero0, ds-zero1, ds-zero2"
    for names, why in (
        (["zero3"], "give at least 2 (got zero3)"),
        (["zero3", "zero3"], "zero3 given twice"),
        (["zero3", "ds-zero4"], "unknown ds-zero4"),
        ([], "unknown (none given)"),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(f"--strategies: {why}; {choices}")):
            variants.memory_specs(BASE_SPEC, strategies=names, at_least=2)


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
        tables.MemoryRow(
            s,
            src,
            dict.fromkeys(tables.COMPONENTS, 2**20 * (i + 1)),
            2**19,
            buckets=2**20 if s.startswith("ds-") and src == "measured" else None,
        )
        for i, s in enumerate(("ddp", "zero3", "ds-zero3"))
        for src in ("measured", "predicted")
    ]
    accum = tables.accumulation_rows([(1, 4, speed, "a"), (2, 2, speed, "b")])
    compare = tables.compare_rows(
        [("zero3", speed, 3 * 2**20, 2**21, "a"), ("ds-zero3", speed, None, 2**22, "b")]
    )
    marks = [(2, "checkpoint_saved"), (3, "restored")]
    written = [
        plots.scaling_png(scaling, tmp_path / "scaling.png"),
        plots.memory_png(mem, tmp_path / "memory.png"),
        plots.accumulation_png(accum, tmp_path / "accumulation.png"),
        plots.compare_png(compare, tmp_path / "compare.png"),
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
