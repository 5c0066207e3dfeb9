"""The `etrain` CLI driven through CliRunner against a fake REST server (httpx.MockTransport)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import httpx
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from service import cli
from tests.support.fakes import ADMIN, ADMIN_H

TOKEN = "s3cret-token-value"
REPO = Path(__file__).resolve().parents[3]
SPEC_YAML = """\
name: gpt-tiny-ddp
model: {preset: gpt-tiny}
train: {steps: 50, global_batch_size: 16}
"""


def make_job(status="QUEUED", step=0, loss=None, world_size=None, **extra):
    """A job object shaped like the server's."""
    metrics = (
        None
        if loss is None
        else {"step": step, "loss": loss, "tokens_per_s": 12345.0, "world_size": world_size}
    )
    return {
        "id": "j-1",
        "name": "gpt-tiny-ddp",
        "status": status,
        "spec": {"train": {"steps": 50}},
        "world_size": world_size,
        "restarts": 0,
        "step": step,
        "metrics": metrics,
        "dashboard_url": "http://127.0.0.1:8265",
        "error": None,
        "warnings": [],
        "created_at": "2026-11-29T10:00:00Z",
        "started_at": None,
        "finished_at": None,
        **extra,
    }


class FakeServer:
    """Answers the etrain REST routes; records every request.

    ``snapshots`` are returned one per GET of the job (the last repeats);
    ``events`` pairs each event with the snapshot index from which it is visible.
    """

    def __init__(self):
        self.requests: list[httpx.Request] = []
        self.snapshots = [make_job()]
        self.events: list[tuple[int, dict]] = []
        self.polls = 0
        self.override: httpx.Response | None = None
        self.plan_result = {"fits": True}
        self.log_chunks = [b"step 1 loss 5.0\n", b"step 2 loss 4.0\n"]
        self.listed = [make_job("RUNNING", 20, 3.25, 2)]

    def visible_events(self, after_id: int) -> list[dict]:
        shown = max(self.polls - 1, 0)
        return [e for at, e in self.events if at <= shown and e["id"] > after_id]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.override is not None:
            return self.override
        method, path = request.method, request.url.path
        if (method, path) == ("POST", "/v1/jobs"):
            return httpx.Response(201, json=self.snapshots[0])
        if (method, path) == ("GET", "/v1/jobs"):
            return httpx.Response(200, json={"items": self.listed, "total": 7})
        if (method, path) == ("GET", "/v1/jobs/j-1"):
            job = self.snapshots[min(self.polls, len(self.snapshots) - 1)]
            self.polls += 1
            return httpx.Response(200, json=job)
        if (method, path) == ("GET", "/v1/jobs/j-1/events"):
            after = int(request.url.params.get("after_id", 0))
            return httpx.Response(200, json={"items": self.visible_events(after)})
        if (method, path) == ("POST", "/v1/jobs/j-1/cancel"):
            return httpx.Response(200, json=make_job("CANCELLED"))
        if (method, path) == ("GET", "/v1/jobs/j-1/logs"):
            if request.url.params.get("follow") == "true":
                return httpx.Response(200, content=iter(self.log_chunks))
            return httpx.Response(200, text="all the logs\n")
        if (method, path) == ("POST", "/v1/plan"):
            return httpx.Response(200, json=self.plan_result)
        return httpx.Response(404, json={"detail": "Not Found"})

    def only(self, method: str, path: str) -> httpx.Request:
        matches = [r for r in self.requests if (r.method, r.url.path) == (method, path)]
        assert len(matches) == 1, [(r.method, r.url.path) for r in self.requests]
        return matches[0]


@pytest.fixture
def server(monkeypatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(cli, "_transport", lambda: httpx.MockTransport(fake))
    monkeypatch.setattr(cli, "POLL_INTERVAL_S", 0)
    # Wide consoles so tables do not wrap ids and names.
    monkeypatch.setattr(cli, "console", Console(width=200, highlight=False))
    monkeypatch.setattr(cli, "err_console", Console(width=200, stderr=True, highlight=False))
    return fake


def run(*args: str):
    """Invoke the CLI with a token in the environment and check the token never leaks."""
    result = CliRunner().invoke(
        cli.app, list(args), env={"ETRAIN_TOKEN": TOKEN, "ETRAIN_URL": "http://etrain.test"}
    )
    assert TOKEN not in result.output
    assert TOKEN not in result.stderr
    return result


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC_YAML)
    return path


def test_submit_yaml_is_sent_as_is(server, spec_file):
    result = run("submit", str(spec_file))
    assert result.exit_code == 0, result.output
    req = server.only("POST", "/v1/jobs")
    assert req.headers["content-type"] == "application/yaml"
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.content == SPEC_YAML.encode()
    assert "j-1" in result.stdout and "gpt-tiny-ddp" in result.stdout and "QUEUED" in result.stdout


def test_submit_json_file_content_type(server, tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(yaml.safe_load(SPEC_YAML)))
    assert run("submit", str(path)).exit_code == 0
    assert server.only("POST", "/v1/jobs").headers["content-type"] == "application/json"


def test_submit_name_override_sends_json(server, spec_file):
    result = run("submit", str(spec_file), "--name", "renamed")
    assert result.exit_code == 0, result.output
    req = server.only("POST", "/v1/jobs")
    assert req.headers["content-type"] == "application/json"
    body = json.loads(req.content)
    assert body["name"] == "renamed" and body["train"]["steps"] == 50


def test_url_and_token_options_override_environment(server, spec_file):
    result = CliRunner().invoke(
        cli.app,
        ["--url", "http://other.test:9000", "--token", "t2", "cancel", "j-1"],
        env={"ETRAIN_TOKEN": TOKEN, "ETRAIN_URL": "http://etrain.test"},
    )
    assert result.exit_code == 0, result.output
    req = server.only("POST", "/v1/jobs/j-1/cancel")
    assert req.url.host == "other.test" and req.url.port == 9000
    assert req.headers["authorization"] == "Bearer t2"


def _follow_script(server: FakeServer, final: dict) -> None:
    server.snapshots = [
        make_job("QUEUED"),
        make_job("RUNNING", 10, 4.5, 2),
        make_job("RUNNING", 20, 3.9, 1, restarts=1),
        make_job("RUNNING", 35, 2.7, 2, restarts=1),
        final,
    ]
    server.events = [
        (
            0,
            {
                "id": 1,
                "ts": "2026-11-29T10:00:00Z",
                "kind": "submitted",
                "message": "job submitted",
            },
        ),
        (1, {"id": 2, "ts": "2026-11-29T10:00:05Z", "kind": "started", "message": "2 workers"}),
        (
            2,
            {
                "id": 3,
                "ts": "2026-11-29T10:00:09Z",
                "kind": "worker_failed",
                "message": "worker 1 died [SIGKILL]",
            },
        ),
        (
            2,
            {
                "id": 4,
                "ts": "2026-11-29T10:00:12Z",
                "kind": "restored",
                "message": "restored from step 20",
            },
        ),
        (3, {"id": 5, "ts": 1795000000.0, "kind": "resized", "message": "resized 1->2"}),
    ]


def test_submit_follow_until_succeeded(server, spec_file):
    _follow_script(server, make_job("SUCCEEDED", 50, 1.234, 2))
    result = run("submit", str(spec_file), "--follow")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("restored from step 20") == 1
    assert "worker_failed: worker 1 died [SIGKILL]" in out  # not eaten as rich markup
    assert "resized: resized 1->2" in out
    assert "SUCCEEDED" in out and "1.234" in out
    assert "eval" not in out  # the job never evaluated
    # Each poll asks only for events after the last one it printed.
    afters = [
        r.url.params.get("after_id") for r in server.requests if r.url.path.endswith("/events")
    ]
    assert afters[0] is None and afters[-1] == "5"
    assert afters == sorted(afters, key=lambda a: int(a or 0))


def test_submit_follow_until_failed_exits_1(server, spec_file):
    _follow_script(server, make_job("FAILED", 35, 2.7, 2, error="max_failures (3) exceeded"))
    result = run("submit", str(spec_file), "--follow")
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert "max_failures (3) exceeded" in result.stderr


def test_follow_ctrl_c_leaves_job_running(server, spec_file, monkeypatch):
    calls = []

    def interrupt(*_):
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", interrupt)
    server.snapshots = [make_job("RUNNING", 5, 4.0, 2)]
    result = run("submit", str(spec_file), "--follow")
    assert calls and result.exit_code == cli.EXIT_INTERRUPTED
    assert "etrain status j-1" in result.stderr and "etrain logs j-1 -f" in result.stderr
    assert not any(r.url.path.endswith("/cancel") for r in server.requests)


def test_jobs_table(server):
    result = run("jobs", "--status", "running", "--limit", "5")
    assert result.exit_code == 0, result.output
    req = server.only("GET", "/v1/jobs")
    assert dict(req.url.params) == {"status": "RUNNING", "limit": "5"}
    row = next(line for line in result.stdout.splitlines() if "j-1" in line)
    for cell in ("gpt-tiny-ddp", "RUNNING", "20/50", "3.25", "2026-11-29 10:00:00"):
        assert cell in row
    assert "1 of 7 jobs" in result.stdout
    assert "eval" not in result.stdout  # no column for jobs that never evaluated


def evaluated(job: dict, eval_loss: float, eval_step: int, **more) -> dict:
    """``job`` with the newest evaluation in its metrics, as the service keeps it."""
    job["metrics"] = {**job["metrics"], "eval_loss": eval_loss, "eval_step": eval_step, **more}
    return job


def test_jobs_table_gets_an_eval_loss_column_once_a_listed_job_evaluated(server):
    server.listed = [
        evaluated(make_job("RUNNING", 20, 3.25, 2), 3.375, 20),
        make_job("RUNNING", 8, 4.5, 2, id="j-2"),
    ]
    result = run("jobs")
    assert result.exit_code == 0, result.output

    def cells(text: str) -> list[str]:
        return [c.strip() for c in text.strip("┃│ ").replace("┃", "│").split("│")]

    lines = result.stdout.splitlines()
    header = cells(next(line for line in lines if "created" in line))
    assert header == ["id", "name", "status", "step", "loss", "eval loss", "world", "created"]
    rows = {
        c[0]: dict(zip(header, c, strict=True)) for c in map(cells, lines) if c[0] in ("j-1", "j-2")
    }
    assert (rows["j-1"]["loss"], rows["j-1"]["eval loss"]) == ("3.25", "3.375")
    assert (rows["j-2"]["loss"], rows["j-2"]["eval loss"]) == ("4.5", "-")


def test_status_summary_and_events(server):
    server.snapshots = [make_job("RUNNING", 20, 3.9, 2, restarts=1)]
    server.polls = 5  # every event is visible
    server.events = [
        (0, {"id": i, "ts": "2026-11-29T10:00:00Z", "kind": "checkpoint", "message": f"saved {i}"})
        for i in range(1, 13)
    ]
    result = run("status", "j-1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        "RUNNING",
        "20/50",
        "restarts   1",
        "loss=3.9",
        "http://127.0.0.1:8265",
        "saved 12",
    ):
        assert text in out
    assert "saved 2\n" not in out and "saved 3" in out  # only the last 10 events


def test_status_and_the_final_line_show_the_newest_evaluation(server, spec_file):
    server.snapshots = [
        evaluated(make_job("RUNNING", 25, 3.9, 2), 3.625, 20, eval_perplexity=37.54)
    ]
    out = run("status", "j-1").stdout
    assert "eval loss  3.625 (ppl 37.54) at step 20\n" in out
    # Without an evaluation there is no such line.
    server.snapshots, server.polls = [make_job("RUNNING", 25, 3.9, 2)], 0
    assert "eval loss" not in run("status", "j-1").stdout

    # A perplexity that overflowed is left out; the progress bar shows the eval loss too.
    _follow_script(server, evaluated(make_job("SUCCEEDED", 50, 1.234, 2), 1.5, 50))
    result = run("submit", str(spec_file), "--follow")
    assert result.exit_code == 0, result.output
    assert "job j-1 SUCCEEDED at step 50, loss 1.234, eval loss 1.5 at step 50\n" in result.stdout
    assert " 50/50 loss 1.234 eval 1.5 12,345 tok/s" in result.stdout


def test_a_dpo_job_shows_its_rewards(server, spec_file):
    rewards = {"rewards_accuracy": 0.8125, "rewards_margin": 0.25}
    job = make_job("RUNNING", 25, 0.6, 2)
    job["metrics"] = {**job["metrics"], **rewards}
    server.snapshots = [job]
    assert "rewards    reward accuracy 0.8125, margin 0.25\n" in run("status", "j-1").stdout
    done = make_job("SUCCEEDED", 50, 0.5, 2)
    done["metrics"] = {**done["metrics"], **rewards}
    _follow_script(server, done)
    result = run("submit", str(spec_file), "--follow")
    assert "loss 0.5, reward accuracy 0.8125, margin 0.25\n" in result.stdout
    # A job of another objective has no such line.
    server.snapshots, server.polls = [make_job("RUNNING", 25, 3.9, 2)], 0
    assert "rewards" not in run("status", "j-1").stdout


def test_status_json(server):
    result = run("status", "j-1", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["id"] == "j-1"


def test_cancel(server):
    result = run("cancel", "j-1")
    assert result.exit_code == 0
    assert server.only("POST", "/v1/jobs/j-1/cancel")
    assert "CANCELLED" in result.stdout


def test_logs(server):
    result = run("logs", "j-1")
    assert result.exit_code == 0
    assert result.stdout == "all the logs\n"
    assert "follow" not in server.only("GET", "/v1/jobs/j-1/logs").url.params


def test_logs_follow_streams(server):
    result = run("logs", "j-1", "-f")
    assert result.exit_code == 0, result.output
    assert server.only("GET", "/v1/jobs/j-1/logs").url.params["follow"] == "true"
    assert result.stdout == "step 1 loss 5.0\nstep 2 loss 4.0\n"


PLAN_FITS = {
    "fits": True,
    "num_params": 124_000_000,
    "per_rank": {
        "params_bytes": 496_000_000,
        "grads_bytes": 496_000_000,
        "optimizer_bytes": 992_000_000,
        "activations_bytes": 2 * 1024**3,
        "buffers_bytes": 0,
        "total_bytes": 4_131_483_648,
    },
    "layout": {"dp": 2, "tp": 1, "pp": 1},
    "warnings": ["checkpoint every 10 steps is frequent"],
    "errors": [],
    "recommendation": "ddp",
}


def test_plan_fits(server, spec_file, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes: 4\ngpus_per_node: 8\n")
    server.plan_result = PLAN_FITS
    result = run("plan", str(spec_file), "--cluster", str(cluster))
    assert result.exit_code == 0, result.output
    body = json.loads(server.only("POST", "/v1/plan").content)
    assert body["spec"]["name"] == "gpt-tiny-ddp" and body["cluster"] == {
        "nodes": 4,
        "gpus_per_node": 8,
    }
    out = result.stdout
    for text in (
        "fits: yes",
        "124.00M",
        "2.00 GiB",
        "3.85 GiB",
        "dp=2",
        "checkpoint every 10",
        "recommendation: ddp",
    ):
        assert text in out


@pytest.mark.parametrize(
    ("args", "cluster"),
    [
        (
            ("--nodes", "4", "--gpus-per-node", "8", "--gpu", "h100", "--interconnect", "nvlink4"),
            {"nodes": 4, "gpus_per_node": 8, "gpu": "h100", "interconnect": "nvlink4"},
        ),
        (("--gpu", "rtx4090", "--gpu", "rtx3060"), {"gpu": ["rtx4090", "rtx3060"]}),
        (
            ("--gpu-memory-gb", "24", "--gpu-memory-gb", "12", "--host-memory-gb", "64"),
            {"gpu_memory_gb": [24.0, 12.0], "host_memory_gb": 64.0},
        ),
    ],
)
def test_plan_cluster_options(server, spec_file, args, cluster):
    server.plan_result = PLAN_FITS
    result = run("plan", str(spec_file), *args)
    assert result.exit_code == 0, result.output
    assert json.loads(server.only("POST", "/v1/plan").content)["cluster"] == cluster


def test_plan_options_override_the_cluster_file(server, spec_file, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: 4\ngpus_per_node: 8\ngpu: a100\n")
    server.plan_result = {
        **PLAN_FITS,
        "breakdown": {"buffers": {"fsdp_all_gather": 2**30}},
        "step_estimate": {"step_s": 0.5, "comm_share": 0.25},
        "candidates": [
            {
                "layout": "fsdp zero3 dp=32",
                "total_gib": 40.0,
                "fits": True,
                "step_s": 0.5,
                "comm_share": 0.25,
            }
        ],
        "recommended_layout": {"layout": "fsdp zero3 dp=32", "reason": "why"},
    }
    result = run("plan", str(spec_file), "--cluster", str(path), "--gpu", "h100")
    assert result.exit_code == 0, result.output
    body = json.loads(server.only("POST", "/v1/plan").content)
    assert body["cluster"] == {"nodes": 4, "gpus_per_node": 8, "gpu": "h100"}
    for text in (
        "buffer: fsdp_all_gather",
        "estimated step: 0.5 s, 25% communicating",
        "fsdp zero3 dp=32: why",
    ):
        assert text in result.stdout


def test_plan_does_not_fit_exits_1(server, spec_file):
    server.plan_result = {**PLAN_FITS, "fits": False, "errors": ["needs 90 GiB per rank; use fsdp"]}
    result = run("plan", str(spec_file))
    assert result.exit_code == 1
    assert "cluster" not in json.loads(server.only("POST", "/v1/plan").content)
    assert "fits: NO" in result.stdout and "needs 90 GiB per rank" in result.stdout


def test_plan_on_mixed_gpus_prints_where_each_rank_goes(server, spec_file, tmp_path):
    """A real plan's placement (two 24 GiB nodes and a 12 GiB one), as the server answers it."""
    from service.planner.planning import plan_job
    from tests.support.specs import MIXED_GPU_CLUSTER, MIXED_GPU_JOB
    from workers.spec import JobSpec

    described = MIXED_GPU_CLUSTER
    cluster = tmp_path / "mixed.yaml"
    cluster.write_text(yaml.safe_dump(described))
    plan = plan_job(JobSpec.model_validate(MIXED_GPU_JOB), cluster=described)
    server.plan_result = plan.model_dump(mode="json")
    result = run("plan", str(spec_file), "--cluster", str(cluster))
    assert result.exit_code == 0, result.output
    assert json.loads(server.only("POST", "/v1/plan").content)["cluster"] == described
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "21.47" in rows["home-1"] and "none fits" in rows["laptop"]
    assert f"placement: {plan.placement.summary}" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("response", "args", "expected"),
    [
        (
            httpx.Response(401, json={"detail": "bad token"}),
            ("jobs",),
            "unauthorized: set ETRAIN_TOKEN",
        ),
        (
            httpx.Response(404, json={"detail": "Not Found"}),
            ("status", "j-404"),
            "job j-404 not found",
        ),
        (
            httpx.Response(404, json={"detail": "Not Found"}),
            ("logs", "j-404", "-f"),
            "job j-404 not found",
        ),
        (
            httpx.Response(
                422, json={"detail": [{"loc": ["body", "train", "steps"], "msg": "must be > 0"}]}
            ),
            ("submit", "SPEC"),
            "train.steps: must be > 0",
        ),
        (
            httpx.Response(
                422,
                json={
                    "detail": {
                        "message": "does not fit",
                        "plan": {"fits": False, "errors": ["90 GiB"]},
                    }
                },
            ),
            ("submit", "SPEC"),
            "plan error: 90 GiB",
        ),
        (
            httpx.Response(422, json={"detail": "spec must be a mapping"}),
            ("submit", "SPEC"),
            "spec must be a mapping",
        ),
    ],
)
def test_http_errors_are_clean(server, spec_file, response, args, expected):
    server.override = response
    result = run(*(str(spec_file) if a == "SPEC" else a for a in args))
    assert result.exit_code == 2
    assert expected in result.stderr
    assert "Traceback" not in result.output


def test_connection_refused_message(monkeypatch):
    def refuse(request):
        raise httpx.ConnectError("Connection refused", request=request)

    monkeypatch.setattr(cli, "_transport", lambda: httpx.MockTransport(refuse))
    result = run("jobs")
    assert result.exit_code == 2
    assert "cannot reach etrain at http://etrain.test: is `etrain serve` running?" in result.stderr


def test_serve_wires_run_server_lazily(monkeypatch):
    calls = []
    fake = types.ModuleType("service.server")
    fake.run_server = lambda **kw: calls.append(kw)
    monkeypatch.setitem(sys.modules, "service.server", fake)
    assert CliRunner().invoke(cli.app, ["serve"]).exit_code == 0
    result = CliRunner().invoke(
        cli.app,
        [
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--ray-address",
            "http://h:8265",
            "--data-dir",
            "/d",
        ],
    )
    assert result.exit_code == 0, result.output
    assert calls == [
        {"host": None, "port": None, "ray_address": None, "data_dir": None},
        {"host": "0.0.0.0", "port": 9000, "ray_address": "http://h:8265", "data_dir": "/d"},
    ]


class _Delegate(httpx.BaseTransport):
    """A transport that sends to the real app of a TestClient (and leaves it open)."""

    def __init__(self, api):
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # Starlette's TestClient uses httpx2 when it is installed (huggingface-hub brings
        # it): send through its own client and hand the answer back as an httpx response.
        sent = self.api.request(
            request.method, str(request.url), headers=request.headers, content=request.read()
        )
        return httpx.Response(sent.status_code, headers=sent.headers, content=sent.content)


def test_token_create_list_revoke_against_the_real_api(client, monkeypatch):
    monkeypatch.setattr(cli, "_transport", lambda: _Delegate(client))
    monkeypatch.setattr(cli, "console", Console(width=200, highlight=False))
    env = {"ETRAIN_TOKEN": ADMIN, "ETRAIN_URL": "http://testserver"}

    def etrain(*args: str):
        result = CliRunner().invoke(cli.app, list(args), env=env)
        assert ADMIN not in result.output
        return result

    created = etrain("token", "create", "team-a", "--name", "ci")
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert secret.startswith("et_")
    listed = etrain("token", "list")
    assert listed.exit_code == 0 and "team-a" in listed.stdout and secret not in listed.stdout
    token_id = next(
        t["id"]
        for t in client.get("/v1/tokens", headers=ADMIN_H).json()["items"]
        if t["tenant"] == "team-a"
    )
    revoked = etrain("token", "revoke", token_id)
    assert revoked.exit_code == 0 and token_id in revoked.stdout
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    again = etrain("token", "revoke", token_id)
    assert again.exit_code == 2 and "no live token" in again.stderr
    reserved = etrain("token", "create", "admin")
    assert reserved.exit_code != 0 and "tenant 'admin' is reserved" in reserved.stderr
    assert "tenant" in reserved.stderr and "et_" not in reserved.stdout
