"""Two tenants on one `etrain serve`: each trains its own job to SUCCEEDED on the real Ray
cluster, from its own data into its own checkpoint area, and neither can read, overwrite
or delete the other's checkpoints or data, or use the other's storage secret, through any
field of a spec, at submit or at plan."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TENANTS = ("team-a", "team-b")


def _spec(name: str, data_path: str) -> dict:
    """A 1-worker job that reads ``data_path`` (text) and checkpoints every 3 steps."""
    return {
        "name": name,
        "data": {"source": "text", "path": data_path, "seq_len": 32},
        "resources": {"workers": 1},
        "train": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 2, "lr": 3e-3},
        "checkpoint": {"every_steps": 3},
    }


def _files(root) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, mtime_ns)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tenants(served, waiter):
    """Tokens of team-a and team-b, a corpus in each data area, and one job of each run
    side by side to the end."""
    heads, jobs = {}, {}
    with served.client() as admin:
        for t in TENANTS:
            r = admin.post("/v1/tokens", json={"tenant": t})
            assert r.status_code == 201, r.text
            heads[t] = r.json()["token"]
    for t in TENANTS:
        area = served.data_dir / "tenants" / t
        area.mkdir(parents=True, exist_ok=True)
        (area / "corpus.txt").write_text(f"{t} private corpus line\n" * 800)
        with served.client(heads[t]) as c:
            r = c.post("/v1/jobs", json=_spec(f"{t}-job", str(area / "corpus.txt")))
            assert r.status_code == 201, r.text
            jobs[t] = r.json()
    for t in TENANTS:
        with served.client(heads[t]) as c:
            waiter(
                lambda c=c, t=t: (
                    c.get(f"/v1/jobs/{jobs[t]['id']}").json()["status"]
                    in ("SUCCEEDED", "FAILED", "CANCELLED")
                ),
                timeout=400,
                what=f"{t}'s job to end",
            )
    return heads, jobs


def test_each_tenant_trains_from_its_own_data_into_its_own_area(served, tenants):
    heads, jobs = tenants
    for t in TENANTS:
        with served.client(heads[t]) as c:
            job = c.get(f"/v1/jobs/{jobs[t]['id']}").json()
            assert job["status"] == "SUCCEEDED", job
            area = served.data_dir / "checkpoints" / t
            assert job["spec"]["checkpoint"]["storage"] == f"file://{area}"
            ckpts = c.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
            assert [ck["step"] for ck in ckpts] == [3, 6]
            assert all(ck["uri"].startswith(f"file://{area}/{job['id']}/") for ck in ckpts)
        # Each area holds its own job's folder only.
        assert {p.name for p in area.iterdir()} == {jobs[t]["id"]}


def _attacks(data_dir, victim_job: str) -> list[tuple[str, dict, list]]:
    """(what, spec changes, loc of the refusal) that reach for team-a's files or secret."""
    a_ckpt = data_dir / "checkpoints" / "team-a"
    step = next((a_ckpt / victim_job).rglob("manifest.json")).parent
    b_corpus = str(data_dir / "tenants" / "team-b" / "corpus.txt")
    s3 = {"storage": "s3://ckpt/team-b"}
    return [
        (
            "overwrite A's job",
            {"checkpoint": {"storage": f"file://{a_ckpt / victim_job}"}},
            "storage",
        ),
        (
            "A's area via ..",
            {"checkpoint": {"storage": f"file://{a_ckpt}/../team-b/../team-a"}},
            "storage",
        ),
        ("A's whole area", {"checkpoint": {"storage": f"file://{a_ckpt}"}}, "storage"),
        (
            "read A's corpus",
            {"data": {"path": str(data_dir / "tenants/team-a/corpus.txt")}},
            "path",
        ),
        ("read A's checkpoint", {"data": {"path": str(step / "manifest.json")}}, "path"),
        ("read A's data via ..", {"data": {"path": b_corpus + "/../../team-a/corpus.txt"}}, "path"),
        (
            "A's secret",
            {"checkpoint": {**s3, "s3": {"credentials_secret": "team-a"}}},
            "credentials_secret",
        ),
        (
            "own endpoint",
            {"checkpoint": {**s3, "s3": {"endpoint_url": "http://127.0.0.1:9"}}},
            "endpoint_url",
        ),
    ]


def test_b_cannot_reach_a_through_any_field(served, tenants):
    heads, jobs = tenants
    before = _files(served.data_dir / "checkpoints" / "team-a")
    b_corpus = str(served.data_dir / "tenants" / "team-b" / "corpus.txt")
    with served.client(heads["team-b"]) as b:
        for what, change, field in _attacks(served.data_dir, jobs["team-a"]["id"]):
            spec = _spec("b-attack", b_corpus)
            for section, values in change.items():
                spec[section] = {**spec[section], **values}
            for route, body in (("/v1/jobs", spec), ("/v1/plan", {"spec": spec})):
                r = b.post(route, json=body)
                assert r.status_code == 422, (what, route, r.text)
                assert any(e["loc"][-1] == field for e in r.json()["detail"]), (what, r.text)
        assert b.get("/v1/jobs").json()["total"] == 1  # its own job only; nothing queued
        a_id = jobs["team-a"]["id"]
        for path in ("", "/checkpoints", "/logs", "/events"):
            assert b.get(f"/v1/jobs/{a_id}{path}").status_code == 404
        assert b.post(f"/v1/jobs/{a_id}/cancel").status_code == 404
    assert _files(served.data_dir / "checkpoints" / "team-a") == before
