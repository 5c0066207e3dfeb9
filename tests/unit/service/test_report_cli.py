"""`etrain report` driven through CliRunner against a fake REST server (httpx.MockTransport):
what it submits, in which order, what it prints and writes, and how it fails."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from service import cli

TOKEN = "report-token-value"
SPEC = {
    "name": "tiny",
    "model": {"preset": "gpt-tiny"},
    "resources": {"workers": 2},
    "train": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 2},
}
PLAN = {
    "fits": True,
    "errors": [],
    "per_rank": {
        "params_bytes": 2**20,
        "grads_bytes": 2**20,
        "optimizer_bytes": 2**21,
        "activations_bytes": 2**18,
        "buffers_bytes": 0,
        "total_bytes": 0,
    },
    "breakdown": {"host_bytes": 0},
    "layout": {"data_parallel": {"min": 2, "max": 2, "current": None}},
}


class Server:
    """Jobs succeed at once; job ``j-<n>`` (the n-th submitted) runs at 1000 x n tokens/s
    after a slow first step."""

    def __init__(self):
        self.requests: list[httpx.Request] = []
        self.submitted: list[dict] = []
        self.plan = PLAN
        self.final = "SUCCEEDED"
        self.data_parallel = {"min": 2, "max": 2, "current": 2}  # SPEC's 2 workers
        self.evals: dict[int, float] = {}  # eval_loss by step, on the steps that evaluated

    def job(self, job_id: str) -> dict:
        n = int(job_id.split("-")[1])
        spec = self.submitted[n - 1]
        return {
            "id": job_id,
            "name": spec["name"],
            "status": self.final,
            "step": 6,
            "spec": spec,
            "world_size": self.data_parallel["current"],
            "data_parallel": self.data_parallel,
            "restarts": 0,
            "error": None,
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/v1/plan":
            return httpx.Response(200, json=self.plan)
        if path == "/v1/jobs":
            self.submitted.append(json.loads(request.content))
            job = {"id": f"j-{len(self.submitted)}", "status": "QUEUED", "spec": {}}
            return httpx.Response(201, json=job)
        job_id, _, tail = path.removeprefix("/v1/jobs/").partition("/")
        n = int(job_id.split("-")[1])
        body = {
            "": lambda: self.job(job_id),
            "events": lambda: {"items": []},
            "cancel": lambda: {**self.job(job_id), "status": "CANCELLED"},
            "metrics": lambda: {
                "items": [
                    {
                        "step": s,
                        "tokens_per_s": 10.0 if s == 1 else 1000.0 * n,
                        "samples_per_s": 1.0,
                        "step_time_s": 0.1,
                        "loss": 5.0 - s / 2,
                        "lr": 1e-3,
                        "ts": f"2026-12-01T00:00:{s:02d}Z",
                        **({"eval_loss": self.evals[s]} if s in self.evals else {}),
                    }
                    for s in range(1, 7)
                ]
            },
            "memory": lambda: {"ranks": self.ranks(n)},
            "goodput": lambda: {
                "wall_s": 10.0,
                "productive_s": 6.0,
                "goodput": 0.6,
                "breakdown": {"startup_s": 4.0},
            },
        }[tail]()
        return httpx.Response(200, json=body)

    def ranks(self, n: int) -> list[dict]:
        """Job n's ranks: state over n, DeepSpeed's reduce buckets when it ran DeepSpeed, and
        the peak of rank 1 (n MiB over its parts) above rank 0's."""
        spec = self.submitted[n - 1]
        deepspeed = spec.get("parallelism", {}).get("strategy") == "deepspeed"
        ranks = []
        for rank in range(2):
            parts = {
                "params_bytes": 2**20 // n,
                "grads_bytes": 2**20 // n,
                "optimizer_bytes": 2**21 // n,
                "activations_bytes": 2**18 - rank,
                **({"buckets_bytes": 2**19} if deepspeed else {}),
            }
            ranks.append({**parts, "peak_bytes": sum(parts.values()) + rank * n * 2**20})
        return ranks

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


@pytest.fixture
def server(monkeypatch) -> Server:
    fake = Server()
    monkeypatch.setattr(cli, "_transport", lambda: httpx.MockTransport(fake))
    monkeypatch.setattr(cli, "POLL_INTERVAL_S", 0)
    monkeypatch.setattr(cli, "console", Console(width=200, highlight=False))
    monkeypatch.setattr(cli, "err_console", Console(width=200, stderr=True, highlight=False))
    return fake


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def run(*args: str):
    result = CliRunner().invoke(
        cli.app, ["report", *args], env={"ETRAIN_TOKEN": TOKEN, "ETRAIN_URL": "http://etrain.test"}
    )
    assert TOKEN not in result.output + result.stderr
    return result


def printed_rows(stdout: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in stdout.splitlines()
        if line.startswith("|") and not line.startswith("|-")
    ]


def test_scaling_plans_every_size_then_runs_them_in_turn(server, spec_file, tmp_path):
    out = tmp_path / "out"
    result = run("scaling", str(spec_file), "--workers", "2,1", "--warmup", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    paths = server.paths()
    assert paths[:2] == ["POST /v1/plan", "POST /v1/plan"] and paths[2] == "POST /v1/jobs"
    assert [(s["name"], s["resources"]["workers"]) for s in server.submitted] == [
        ("report-scaling-w1", 1),
        ("report-scaling-w2", 2),
    ]
    assert all(s["train"]["global_batch_size"] == 8 for s in server.submitted)
    header, one, two = printed_rows(result.stdout)
    assert header[:1] == ["workers"]
    # The slow first step is left out: 1000 and 2000 tokens/s, so speedup 2, efficiency 1.
    assert one[:2] == ["1", "1000.0"] and one[4:7] == ["1.000", "1.000", "1.000"]
    assert two[:2] == ["2", "2000.0"] and two[4:7] == ["2.000", "2.000", "1.000"]
    assert (out / "scaling.png").stat().st_size > 5000
    assert "![scaling](scaling.png)" in (out / "report.md").read_text()


def printed_table(stdout: str) -> list[dict[str, str]]:
    header, *rows = printed_rows(stdout)
    return [dict(zip(header, row, strict=True)) for row in rows]


def test_memory_runs_every_strategy_beside_their_plans(server, spec_file, tmp_path):
    result = run("memory", str(spec_file), "--out", str(tmp_path / "m"))
    assert result.exit_code == 0, result.output
    names = ["ddp", "zero2", "zero3", "zero3-offload"]
    names += ["ds-zero0", "ds-zero1", "ds-zero2", "ds-zero3", "ds-zero3-offload"]
    assert [s["name"] for s in server.submitted] == [f"report-memory-{n}" for n in names]
    assert [s["parallelism"]["strategy"] for s in server.submitted[4:]] == ["deepspeed"] * 5
    stages = [s["parallelism"]["deepspeed"]["zero_stage"] for s in server.submitted[4:]]
    assert stages == [0, 1, 2, 3, 3]
    assert all(s["train"]["steps"] == 3 for s in server.submitted)
    rows = printed_table(result.stdout)
    assert [(r["strategy"], r["source"]) for r in rows] == [
        (n, source) for n in names for source in ("measured", "predicted")
    ]
    ddp, zero3 = rows[0], rows[4]
    assert ddp["state"] == "4.00" and zero3["strategy"] == "zero3" and zero3["state"] == "1.33"
    # DeepSpeed's reduce buckets (0.5 MiB here) have a column of their own, counted in the
    # total; FSDP measures none and the plan counts its own among its buffers (other).
    ds_zero3 = rows[14]
    assert ds_zero3["strategy"] == "ds-zero3" and ds_zero3["buckets"] == "0.50"
    assert float(ds_zero3["total"]) == pytest.approx(
        float(ds_zero3["state"]) + float(ds_zero3["activations"]) + 0.5, abs=0.011
    )
    assert zero3["buckets"] == "0.00" and rows[5]["buckets"] == "-"
    assert (tmp_path / "m" / "memory.png").is_file()


def test_memory_runs_only_the_strategies_asked(server, spec_file, tmp_path):
    args = ("--strategies", "zero3,ddp,ds-zero3-offload", "--out", str(tmp_path / "m"))
    assert run("memory", str(spec_file), *args).exit_code == 0
    assert [s["name"] for s in server.submitted] == [
        "report-memory-zero3",
        "report-memory-ddp",
        "report-memory-ds-zero3-offload",
    ]
    assert server.submitted[2]["parallelism"] == {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    }


def test_deepspeed_runs_keep_the_specs_deepspeed_tuning(server, tmp_path):
    tuned = {"zero_stage": 2, "reduce_bucket_size": 1_000_000, "overlap_comm": True}
    path = tmp_path / "ds.yaml"
    path.write_text(
        yaml.safe_dump({**SPEC, "parallelism": {"strategy": "deepspeed", "deepspeed": tuned}})
    )
    args = ("--strategies", "ddp,ds-zero1,ds-zero3", "--out", str(tmp_path / "m"))
    assert run("memory", str(path), *args).exit_code == 0
    ddp, zero1, zero3 = (s["parallelism"] for s in server.submitted)
    assert ddp == {"strategy": "ddp"}  # replaced whole: no DeepSpeed section
    assert zero1["deepspeed"] == {"zero_stage": 1, "reduce_bucket_size": 1_000_000}
    assert zero3["deepspeed"] == {**tuned, "zero_stage": 3}


def test_compare_runs_fsdp_then_deepspeed_zero3_side_by_side(server, spec_file, tmp_path):
    out = tmp_path / "c"
    result = run("compare", str(spec_file), "--steps", "4", "--warmup", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    paths = server.paths()
    assert paths[:3] == ["POST /v1/plan", "POST /v1/plan", "POST /v1/jobs"]  # planned first
    assert [s["name"] for s in server.submitted] == [
        "report-compare-zero3",
        "report-compare-ds-zero3",
    ]
    assert [s["parallelism"]["strategy"] for s in server.submitted] == ["fsdp", "deepspeed"]
    assert [s["train"]["steps"] for s in server.submitted] == [4, 4]
    rows = printed_table(result.stdout)
    assert [(r["strategy"], r["job"]) for r in rows] == [("zero3", "j-1"), ("ds-zero3", "j-2")]
    # After the slow first step: 1000 and 2000 tokens/s at 0.1 s a step.
    assert [(r["tokens/s"], r["step ms"], r["relative"]) for r in rows] == [
        ("1000.0", "100.0", "1.000"),
        ("2000.0", "100.0", "2.000"),
    ]
    # The peak of the rank holding most (rank 1: its parts and n MiB more) and the plan's
    # device total (its per-rank parts: 4.25 MiB).
    for n, row in enumerate(rows, start=1):
        parts = 2 * (2**20 // n) + 2**21 // n + 2**18 - 1 + (2**19 if n == 2 else 0)
        assert row["peak MiB"] == f"{(parts + n * 2**20) / 2**20:.2f}"
        assert row["predicted MiB"] == "4.25"
    assert (out / "compare.png").stat().st_size > 5000
    report = (out / "report.md").read_text()
    assert "![compare](compare.png)" in report and "| ds-zero3 | j-2 |" in report


def test_compare_runs_the_strategies_asked_in_their_order(server, spec_file, tmp_path):
    args = ("--strategies", "ds-zero2,ddp,zero2", "--warmup", "1", "--out", str(tmp_path / "c"))
    result = run("compare", str(spec_file), *args)
    assert result.exit_code == 0, result.output
    assert [s["name"] for s in server.submitted] == [
        "report-compare-ds-zero2",
        "report-compare-ddp",
        "report-compare-zero2",
    ]
    relative = [r["relative"] for r in printed_table(result.stdout)]
    assert relative == ["1.000", "2.000", "3.000"]  # against ds-zero2, the first


def test_accumulation_sets_the_micro_batch(server, spec_file, tmp_path):
    args = ("--micro", "1,4", "--steps", "4", "--out", str(tmp_path / "a"))
    result = run("accumulation", str(spec_file), *args)
    assert result.exit_code == 0, result.output
    assert [s["train"]["micro_batch_size"] for s in server.submitted] == [1, 4]
    assert [s["train"]["steps"] for s in server.submitted] == [4, 4]
    rows = printed_rows(result.stdout)
    assert [r[:2] for r in rows[1:]] == [["1", "4"], ["4", "1"]]


def test_accumulation_follows_the_apis_degree_at_the_size_the_job_ran_at(
    server, spec_file, tmp_path
):
    degrees = {"min": 1, "max": 2}  # an elastic job that ran at 1 worker
    server.plan = {**PLAN, "layout": {"data_parallel": {**degrees, "current": None}}}
    server.data_parallel = {**degrees, "current": 1}
    result = run("accumulation", str(spec_file), "--micro", "2", "--out", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    assert [r[:2] for r in printed_rows(result.stdout)[1:]] == [["2", "4"]]  # 8 / (2 x 1)
    server.plan = {**PLAN, "layout": {"data_parallel": {"min": 1, "max": 8, "current": None}}}
    refused = run("accumulation", str(spec_file), "--micro", "2", "--out", str(tmp_path / "b"))
    assert refused.exit_code == 2 and "--micro 2 x data-parallel degree 8" in refused.stderr


def test_job_report_writes_each_curve_and_the_goodput(server, spec_file, tmp_path):
    server.submitted.append(SPEC)
    result = run("job", "j-1", "--out", str(tmp_path / "j"))
    assert result.exit_code == 0, result.output
    assert ["goodput", "0.600"] in printed_rows(result.stdout)
    for name in ("loss", "lr", "tokens_per_s", "goodput"):
        assert (tmp_path / "j" / f"{name}.png").stat().st_size > 5000
    assert "![loss](loss.png)" in (tmp_path / "j" / "report.md").read_text()
    # A job that never evaluated has no eval curve and no eval row.
    assert not (tmp_path / "j" / "eval_loss.png").exists()
    assert not [row for row in printed_rows(result.stdout) if "eval" in row[0]]


def test_job_report_draws_the_eval_loss_of_the_steps_that_evaluated(server, tmp_path):
    server.submitted.append(SPEC)
    server.evals = {3: 3.75, 6: 3.5}
    result = run("job", "j-1", "--out", str(tmp_path / "j"))
    assert result.exit_code == 0, result.output
    assert ["final eval loss", "3.5000 at step 6"] in printed_rows(result.stdout)
    assert (tmp_path / "j" / "eval_loss.png").stat().st_size > 5000
    assert "![eval_loss](eval_loss.png)" in (tmp_path / "j" / "report.md").read_text()


def test_planner_errors_stop_before_any_job(server, spec_file, tmp_path):
    server.plan = {**PLAN, "fits": False, "errors": ["tp=2 does not divide n_heads"]}
    result = run("scaling", str(spec_file), "--workers", "1,2", "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert "report-scaling-w1 cannot run" in result.stderr and "n_heads" in result.stderr
    assert not server.submitted and not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", ["memory", "compare"])
def test_a_job_that_reported_no_memory_exits_1_naming_it(server, spec_file, tmp_path, command):
    server.ranks = lambda n: []
    result = run(command, str(spec_file), "--out", str(tmp_path / "n"))
    assert result.exit_code == 1
    assert "job j-1 reported no memory" in result.stderr and len(server.submitted) == 1


def test_a_failed_job_exits_1_naming_it(server, spec_file, tmp_path):
    server.final = "FAILED"
    result = run("accumulation", str(spec_file), "--micro", "2", "--out", str(tmp_path / "f"))
    assert result.exit_code == 1
    assert "job j-1 (report-accumulation-m2) FAILED" in result.stderr


@pytest.mark.parametrize("args", [("scaling", "--workers", "1"), ("compare",)])
def test_ctrl_c_cancels_the_job_in_flight(server, spec_file, tmp_path, monkeypatch, args):
    def interrupt(*_):
        raise KeyboardInterrupt

    server.final = "RUNNING"
    monkeypatch.setattr(cli, "_pause", interrupt)
    result = run(args[0], str(spec_file), *args[1:], "--out", str(tmp_path / "c"))
    assert result.exit_code == cli.EXIT_INTERRUPTED
    assert "POST /v1/jobs/j-1/cancel" in server.paths()
    assert "cancelled job j-1" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("scaling", "--workers", "1,x"), "not a comma-separated list"),
        (("scaling", "--workers", "0,2"), "distinct integers >= 1"),
        (("scaling", "--workers", "2,2"), "distinct integers >= 1"),
        (("accumulation", "--micro", ""), "distinct integers >= 1"),
        (("scaling", "--warmup", "-1"), "--warmup"),
        (("memory", "--steps", "0"), "--steps"),
        (("accumulation", "--micro", "3"), "--micro 3"),
        (("memory", "--strategies", "ddp,zero9"), "unknown zero9; choose from ddp, zero2"),
        (("memory", "--strategies", ","), "unknown (none given)"),
        (("memory", "--strategies", "ddp,ddp"), "--strategies: ddp given twice"),
        (("compare", "--strategies", "zero3,ds-zero9"), "unknown ds-zero9; choose from ddp"),
        (
            ("compare", "--strategies", "zero3"),
            "--strategies: give at least 2 (got zero3); choose from ddp, zero2, zero3, "
            "zero3-offload, ds-zero0, ds-zero1, ds-zero2, ds-zero3, ds-zero3-offload",
        ),
        (("compare", "--warmup", "-1"), "--warmup"),
    ],
)
def test_argument_errors(server, spec_file, args, expected):
    result = run(args[0], str(spec_file), *args[1:])
    assert result.exit_code == 2
    assert expected in result.output + result.stderr
    assert not server.submitted


def test_missing_spec_and_unknown_job(server, tmp_path, monkeypatch):
    assert run("scaling", str(tmp_path / "nope.yaml")).exit_code == 2
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- 1\n")
    result = run("memory", str(not_a_mapping))
    assert result.exit_code == 2 and "is not a mapping" in result.stderr
    monkeypatch.setattr(
        cli, "_transport", lambda: httpx.MockTransport(lambda r: httpx.Response(404, json={}))
    )
    result = run("job", "j-missing")
    assert result.exit_code == 2 and "job j-missing not found" in result.stderr
