"""model.hf and model.tokenizer are untrusted places, like data.path: the security table.

Each refused case is a 422 from the access policy whose loc names the field and whose
msg names the rule and the fix, on submit and on plan; nothing is read from the place.
The allowed cases get past the policy (a folder in the tenant's area or a shared data
root, an object-store prefix listed for the tenant).
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.support.api import api_client, tenant_token
from tests.support.fakes import FakeBackend
from tests.support.hf_fixtures import hf_config

A, B = "team-a", "team-b"
POLICY = {"policy_object_stores": {"*": ["s3://models/{tenant}", "gs://models/{tenant}"]}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One app for the table: tenant A's token, folders of A, B and a shared root."""
    tmp_path, shared = tmp_path_factory.mktemp("svc"), tmp_path_factory.mktemp("shared")
    for folder in (tmp_path / "tenants" / A / "m", tmp_path / "tenants" / B / "m", shared / "m"):
        folder.mkdir(parents=True)
        hf_config().to_json_file(folder / "config.json")
        (folder / "model.safetensors").write_bytes(b"")
    os.symlink(tmp_path / "tenants" / B / "m", tmp_path / "tenants" / A / "escape")
    os.symlink("/etc", tmp_path / "tenants" / A / "etc")
    with api_client(
        tmp_path, FakeBackend(cpus=4), **POLICY, policy_shared_data_roots=[shared]
    ) as c:
        yield c, tenant_token(c, A), tmp_path, shared


def _body(field: str, place: str) -> dict:
    model = {"hf": place} if field == "hf" else {"tokenizer": place}
    return {
        "name": "m",
        "model": model,
        "data": {"seq_len": 16, "num_samples": 8},
        "resources": {"workers": 1},
        "train": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 2},
    }


REFUSED = {
    "system folder": ("/etc", "system folder"),
    "another tenant's area": ("{root}/tenants/team-b/m", "another tenant's data area"),
    "symlink escape": ("{root}/tenants/team-a/escape", "another tenant's data area"),
    "symlink to /etc": ("{root}/tenants/team-a/etc", "system folder"),
    "dot-dot escape": ("{root}/tenants/team-a/../team-b/m", "another tenant's data area"),
    "service data dir": ("{root}", "the service's data dir"),
    "relative path": ("tenants/team-a/m", "absolute path"),
    "file:// outside": ("file:///etc", "system folder"),
    "another tenant's store": ("s3://models/team-b/llama", "ETRAIN_POLICY_OBJECT_STORES"),
    "unlisted store": ("gs://elsewhere/llama", "ETRAIN_POLICY_OBJECT_STORES"),
    # Read with the service's own keys (no s3:// checkpoint.storage with a secret).
    "s3 with the service's keys": ("s3://models/team-a/llama", "ETRAIN_POLICY_AMBIENT_CREDENTIALS"),
    "other scheme": ("http://example.com/m", "s3:// or gs://"),
}


@pytest.mark.parametrize("field", ["hf", "tokenizer"])
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_model_places_refused(env, case, route, field):
    c, h, root, _ = env
    place, words = REFUSED[case]
    body = _body(field, place.format(root=root))
    r = c.post(route, json=body if route == "/v1/jobs" else {"spec": body}, headers=h)
    assert r.status_code == 422, r.text
    items = r.json()["detail"]
    assert [i["loc"] for i in items] == [["body", "model", field]], items
    assert words in items[0]["msg"] and "use" in items[0]["msg"], items[0]["msg"]
    assert items[0]["type"] == "policy"


@pytest.mark.parametrize(
    "place", ["{root}/tenants/team-a/m", "file://{root}/tenants/team-a/m", "{shared}/m"]
)
def test_model_places_allowed(env, place):
    c, h, root, shared = env
    r = c.post("/v1/jobs", json=_body("hf", place.format(root=root, shared=shared)), headers=h)
    assert r.status_code == 201, r.text


def test_a_listed_store_passes_the_policy_and_is_read_in_a_probe_thread(env, monkeypatch):
    """The policy allows the tenant's own prefix; the service then reads its config.json
    in a probe thread (never the event loop's), and its answer decides the 422."""
    from service.domain import model_source

    c, h, _, _ = env
    seen, answer = [], {"weights": True}

    def read(spec, timeout_s):
        seen.append((spec.model.hf, threading.current_thread().name, timeout_s > 0))
        return hf_config().to_json_string().encode(), answer["weights"]

    monkeypatch.setattr(model_source, "read_remote_model", read)
    r = c.post("/v1/jobs", json=_body("hf", "gs://models/team-a/llama"), headers=h)
    assert r.status_code == 201, r.text
    assert seen == [("gs://models/team-a/llama", "etrain-probe", True)]
    answer["weights"] = False
    r = c.post("/v1/plan", json={"spec": _body("hf", "gs://models/team-a/llama")}, headers=h)
    assert r.status_code == 422
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "model", "hf"], item
    assert "has no weights" in item["msg"], item["msg"]
