"""data.path on an object store: allowed only under the tenant's listed prefixes, and on
s3:// only with the job's own secret (stores.s3.credentials_secret, whatever
checkpoint.storage is) unless the tenant may use the service's keys; through
submit and plan, against the real app on a fake backend (the probes record, send nothing;
tests/integration/test_data_object_store.py reads a real store at submit). Every case
runs for data.path and for the evaluation source's data.eval.path alike.
"""

from __future__ import annotations

import pytest

from service.domain import data_check
from tests.unit.service.security.test_spec_access import (
    ENDPOINT,
    B,
    _headers,
    env,  # noqa: F401 - the app fixture
    refused_with,
)

SECTIONS = {"data": ["data", "path"], "data.eval": ["data", "eval", "path"]}
TINY = {
    "name": "tiny",
    "resources": {"workers": 1},
    "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 4},
    "model": {"tokenizer": "s3://ckpt/team-b/tok"},
}
OWN_SECRET = {"stores": {"s3": {"endpoint_url": ENDPOINT, "credentials_secret": B}}}
OWN_STORE = {"checkpoint": {"storage": "s3://ckpt/team-b/run"}, **OWN_SECRET}


def _spec(path: str, sections: dict | None = None, source: str = "jsonl") -> dict:
    data = {"source": source, "path": path, "seq_len": 16}
    return {**TINY, "data": data, **(sections or {})}


def _in(section: str, spec: dict) -> dict:
    """``spec`` with its data source given as ``section`` (data.eval: beside synthetic
    training data of the same seq_len)."""
    if section == "data":
        return spec
    source = {k: v for k, v in spec["data"].items() if k != "seq_len"}
    return {**spec, "data": {"seq_len": spec["data"]["seq_len"], "eval": source}}


def _path_of(section: str, spec: dict):
    data = spec["data"]
    return data["path"] if section == "data" else data["eval"]["path"]


# (id, tenant, spec, words the data.path refusal must hold)
REFUSED = [
    (
        "other-tenants-prefix",
        B,
        _spec("s3://ckpt/team-a/rows.jsonl", OWN_STORE),
        "not in an object-store prefix tenant 'team-b' may use (allowed: s3://ckpt/team-b)",
    ),
    (
        "prefix-lookalike",
        B,
        _spec("s3://ckpt/team-bb/rows.jsonl", OWN_STORE),
        "ETRAIN_POLICY_OBJECT_STORES",
    ),
    ("unlisted-bucket", B, _spec("s3://elsewhere/rows.jsonl", OWN_STORE), "allowed: s3://ckpt"),
    ("unlisted-gcs", B, _spec("gs://ckpt/team-b/rows.jsonl"), "not in an object-store prefix"),
    (
        "service-keys",
        B,
        _spec("s3://ckpt/team-b/rows.jsonl"),
        "would be read with the service's own keys",
    ),
    ("prepared-other-tenant", B, _spec("s3://ckpt/team-a/prep", OWN_STORE, "prepared"), "team-b"),
    ("other-scheme", B, _spec("http://example.com/rows.jsonl"), "must be an absolute path"),
]
ALLOWED = [
    ("own-prefix-own-secret", B, _spec("s3://ckpt/team-b/rows.jsonl", OWN_STORE)),
    ("prepared-own-prefix", B, _spec("s3://ckpt/team-b/prep", OWN_STORE, "prepared")),
    # The secret serves every s3:// path: no s3:// checkpoint.storage is needed for it.
    ("own-secret-local-checkpoints", B, _spec("s3://ckpt/team-b/rows.jsonl", OWN_SECRET)),
]


@pytest.mark.parametrize(("case", "tenant", "spec", "words"), REFUSED, ids=[r[0] for r in REFUSED])
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
@pytest.mark.parametrize("section", SECTIONS)
def test_object_store_data_path_refused(
    env,  # noqa: F811
    monkeypatch,
    section,
    route,
    case,
    tenant,
    spec,
    words,
):
    c, tokens, probed, _ = env
    read = []
    monkeypatch.setattr(data_check, "_check_remote", lambda *a: read.append(a))
    refused_with(c, route, _in(section, spec), _headers(tokens, tenant), SECTIONS[section], words)
    assert probed == [] and read == []  # nothing was sent to a store it refused


@pytest.mark.parametrize(("case", "tenant", "spec"), ALLOWED, ids=[a[0] for a in ALLOWED])
@pytest.mark.parametrize("section", SECTIONS)
def test_object_store_data_path_allowed(env, monkeypatch, section, case, tenant, spec):  # noqa: F811
    c, tokens, _, _ = env
    read = []
    monkeypatch.setattr(data_check, "_check_remote", lambda url, *_: read.append(url))
    spec = _in(section, spec)
    r = c.post("/v1/jobs", json=spec, headers=_headers(tokens, tenant))
    assert r.status_code == 201, r.text
    assert read == [_path_of(section, spec)]  # its head was checked (in a probe thread)
    assert _path_of(section, r.json()["spec"]) == _path_of(section, spec)
    plan = c.post("/v1/plan", json={"spec": spec}, headers=_headers(tokens, tenant))
    assert plan.status_code == 200, plan.text
