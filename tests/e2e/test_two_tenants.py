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
            assert job["status"] == "SUCCEEDED", (job["error"] or "")[-3000:]
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
            {"checkpoint": s3, "stores": {"s3": {"credentials_secret": "team-a"}}},
            "credentials_secret",
        ),
        (
            "own endpoint",
            {"checkpoint": s3, "stores": {"s3": {"endpoint_url": "http://127.0.0.1:9"}}},
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
                spec[section] = {**spec.get(section, {}), **values}
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


def test_b_tricks_in_its_own_area_after_submit_reach_nothing_of_a(served, tenants, waiter):
    """What the submit check cannot see: after the service accepted them, B swaps its data
    file for a link to A's corpus, and plants its next job's checkpoint folder as a link to
    A's job. The workers and the driver check at the moment of use: both jobs fail naming
    the refusal, no byte of A's corpus reaches B's job, logs or errors, and A's checkpoint
    folder is unchanged (bytes and mtimes)."""
    heads, jobs = tenants
    a_ckpt = served.data_dir / "checkpoints" / "team-a"
    before = _files(a_ckpt)
    b_area = served.data_dir / "tenants" / "team-b"
    trick = b_area / "trick.txt"
    trick.write_text("team-b harmless line\n" * 800)
    a_corpus = served.data_dir / "tenants" / "team-a" / "corpus.txt"
    with served.client(heads["team-b"]) as b:
        r = b.post("/v1/jobs", json=_spec("b-swap", str(trick)))
        assert r.status_code == 201, r.text
        swapped = r.json()["id"]
        trick.unlink()
        trick.symlink_to(a_corpus)
        r = b.post("/v1/jobs", json=_spec("b-link", str(b_area / "corpus.txt")))
        assert r.status_code == 201, r.text
        linked = r.json()["id"]
        (served.data_dir / "checkpoints" / "team-b" / linked).symlink_to(
            a_ckpt / jobs["team-a"]["id"]
        )
        ended = {}

        def done(job_id: str) -> bool:
            ended[job_id] = b.get(f"/v1/jobs/{job_id}").json()
            return ended[job_id]["status"] in ("SUCCEEDED", "FAILED", "CANCELLED")

        for job_id in (swapped, linked):
            waiter(lambda j=job_id: done(j), timeout=400, what=f"B's job {job_id} to end")
        for job_id, words in ((swapped, "outside the folders"), (linked, "is a link")):
            job = ended[job_id]
            assert job["status"] == "FAILED", job
            said = b.get(f"/v1/jobs/{job_id}/logs").text + (job["error"] or "")
            assert words in said, (job["error"], said[-2000:])
            assert "private corpus" not in said
            assert b.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"] == []
    assert _files(a_ckpt) == before
