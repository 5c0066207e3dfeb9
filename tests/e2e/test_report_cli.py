"""`etrain report` against a real `etrain serve` on the session's Ray cluster: real jobs,
real metrics and memory, PNGs that load, tables that agree with themselves."""

from __future__ import annotations

import matplotlib.image
import pytest
import yaml

pytestmark = pytest.mark.slow

TINY = {
    "name": "report-e2e",
    "model": {"preset": "gpt-tiny"},
    "data": {"seq_len": 32, "num_samples": 256},
    "resources": {"workers": 2},
    "train": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3},
    "checkpoint": {"every_steps": 3},
}
# TINY as a DeepSpeed job, tuned as the reports' ds-* runs keep it: a small reduce bucket
# (DeepSpeed's default, 5e8 fp32 elements, is 1.9 GiB a rank at ZeRO-3), and every
# parameter partitioned at ZeRO-3 (by default one under 1e5 elements, here every one of
# gpt-tiny's, stays whole on each rank).
BUCKET = 1_000_000
TUNED = {"reduce_bucket_size": BUCKET, "stage3_param_persistence_threshold": 0}
TINY_DS = {
    **TINY,
    "parallelism": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2, **TUNED}},
}


def write_spec(tmp_path, spec: dict = TINY):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def table_rows(stdout: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the printed (markdown-shaped) table whose first column is ``first_header``."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    start = next(i for i, row in enumerate(cells) if row[0] == first_header)
    headers, rows = cells[start], []
    for row in cells[start + 1 :]:
        if set("".join(row)) <= set("-: "):
            continue  # the separator line
        if row[0] == headers[0] or len(row) != len(headers):
            break
        rows.append(dict(zip(headers, row, strict=True)))
    return rows


def assert_png(path, minimum_bytes: int = 5000):
    assert path.is_file() and path.stat().st_size > minimum_bytes, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0


def run_ok(served, *args: str):
    result = served.cli(*args, timeout=600)  # a loaded 2-core machine starts workers slowly
    assert result.returncode == 0, result.stdout + result.stderr
    assert served.token not in result.stdout + result.stderr
    print(result.stdout)  # the tables, shown by pytest -rA
    return result


def test_scaling_then_the_job_report_of_its_largest_run(served, tmp_path):
    out = tmp_path / "scaling"
    args = ("--workers", "1,2", "--steps", "6", "--warmup", "2", "--out", str(out))
    result = run_ok(served, "report", "scaling", str(write_spec(tmp_path)), *args)
    rows = table_rows(result.stdout, "workers")
    assert [r["workers"] for r in rows] == ["1", "2"]
    assert rows[0]["speedup"] == "1.000" and rows[0]["efficiency"] == "1.000"
    two = rows[1]
    assert float(two["ideal"]) == 2.0 and float(two["tokens/s"]) > 0
    assert float(two["efficiency"]) == pytest.approx(float(two["speedup"]) / 2, abs=1e-3)
    assert_png(out / "scaling.png")
    assert "![scaling](scaling.png)" in (out / "report.md").read_text()
    with served.client() as c:
        job = c.get(f"/v1/jobs/{two['job']}").json()
    assert job["name"] == "report-scaling-w2" and job["world_size"] == 2

    job_out = tmp_path / "job"
    result = run_ok(served, "report", "job", two["job"], "--out", str(job_out))
    fields = {r["field"]: r["value"] for r in table_rows(result.stdout, "field")}
    assert fields["job"] == two["job"] and fields["steps"] == "6"
    assert float(fields["final loss"]) > 0 and 0 < float(fields["goodput"]) <= 1
    for name in ("loss", "lr", "tokens_per_s", "goodput"):
        assert_png(job_out / f"{name}.png")
    report = (job_out / "report.md").read_text()
    assert "![loss](loss.png)" in report and "checkpoint_saved" in report


def test_memory_measured_and_predicted_ddp_against_deepspeed_zero3(served, tmp_path):
    out = tmp_path / "memory"
    # Two of the nine strategies (the unit tests check that all nine are submitted): each
    # run is a job start, the most of this file's wall time.
    args = ("--strategies", "ddp,ds-zero3", "--steps", "2", "--out", str(out))
    result = run_ok(served, "report", "memory", str(write_spec(tmp_path, TINY_DS)), *args)
    rows = {(r["strategy"], r["source"]): r for r in table_rows(result.stdout, "strategy")}
    strategies = ("ddp", "ds-zero3")
    assert set(rows) == {(s, src) for s in strategies for src in ("measured", "predicted")}
    measured = {s: float(rows[s, "measured"]["state"]) for s in strategies}
    # ZeRO-3 over 2 ranks with AdamW: params 4/2, grads 4/2 and the optimizer 12/2 bytes a
    # parameter (two moments and the fp32 master copy) against DDP's 4 + 4 + 8: 10/16.
    assert 0.5 * measured["ddp"] < measured["ds-zero3"] < 0.75 * measured["ddp"]
    # Its reduce bucket, reduce_bucket_size fp32 elements (the spec's, kept by the run).
    assert rows["ds-zero3", "measured"]["buckets"] == f"{4 * BUCKET / 2**20:.2f}"
    assert rows["ddp", "measured"]["buckets"] == "0.00"
    predicted = {s: float(rows[s, "predicted"]["state"]) for s in strategies}
    assert 0 < predicted["ds-zero3"] < predicted["ddp"]
    assert all(float(rows[s, "predicted"]["total"]) > predicted[s] for s in strategies)
    assert_png(out / "memory.png")


def test_compare_fsdp_and_deepspeed_zero3_side_by_side(served, tmp_path):
    out = tmp_path / "compare"
    spec = write_spec(tmp_path, TINY_DS)
    args = ("--strategies", "zero3,ds-zero3", "--steps", "4", "--warmup", "1", "--out", str(out))
    result = run_ok(served, "report", "compare", str(spec), *args)
    rows = table_rows(result.stdout, "strategy")
    assert [r["strategy"] for r in rows] == ["zero3", "ds-zero3"]
    first, second = rows
    assert all(float(r["tokens/s"]) > 0 and float(r["step ms"]) > 0 for r in rows)
    assert first["relative"] == "1.000"
    want = float(second["tokens/s"]) / float(first["tokens/s"])
    assert float(second["relative"]) == pytest.approx(want, abs=1e-3)
    assert all(float(r["peak MiB"]) > 0 and float(r["predicted MiB"]) > 0 for r in rows)
    # DeepSpeed's ZeRO-3 keeps its reduce bucket allocated on top of the state.
    assert float(second["peak MiB"]) > 4 * BUCKET / 2**20
    assert_png(out / "compare.png")
    assert "![compare](compare.png)" in (out / "report.md").read_text()
    with served.client() as c:
        job = c.get(f"/v1/jobs/{second['job']}").json()
    assert job["name"] == "report-compare-ds-zero3"
    assert job["spec"]["parallelism"]["deepspeed"].items() >= TUNED.items()


def test_accumulation_rows_for_each_micro_batch(served, tmp_path):
    out = tmp_path / "accumulation"
    spec = write_spec(tmp_path)
    args = ("--micro", "1,2", "--steps", "5", "--warmup", "1", "--out", str(out))
    result = run_ok(served, "report", "accumulation", str(spec), *args)
    rows = table_rows(result.stdout, "micro")
    # Global batch 8 over 2 data-parallel ranks: 4 and 2 micro-batches per step.
    assert [(r["micro"], r["accumulation"]) for r in rows] == [("1", "4"), ("2", "2")]
    assert rows[0]["relative"] == "1.000" and all(float(r["tokens/s"]) > 0 for r in rows)
    assert_png(out / "accumulation.png")


def test_a_bad_spec_shows_the_api_error_and_runs_nothing(served, tmp_path):
    bad = {**TINY, "train": {**TINY["train"], "lr": -1}}
    with served.client() as c:
        before = c.get("/v1/jobs").json()["total"]
    result = served.cli("report", "scaling", str(write_spec(tmp_path, bad)), "--workers", "1,2")
    assert result.returncode == 2
    assert "train.lr" in result.stderr
    with served.client() as c:
        assert c.get("/v1/jobs").json()["total"] == before
