"""What a tenant's job spec may touch (items 1, 2, 4, 5): every field that names a place,
through submit and plan, against the real app on a fake backend. The data file cases run
for data.path and for the evaluation source's data.eval.path alike.

Each refused case is a 422 whose loc names the field and whose msg names the rule and
the fix, and no probe request leaves the service for it; the allowed cases are 201
(submit) and 200 (plan). The object-store probe itself is replaced by a recorder
here (there is no store in this tier); tests/integration/test_storage_check.py probes
real ones, and test_probe_bounds.py a store that never answers.
"""

from __future__ import annotations

import os

import pytest

from service.domain import storage_check
from tests.support.api import api_client, tenant_token
from tests.support.fakes import ADMIN_H, FakeBackend

A, B = "team-a", "team-b"
ENDPOINT = "http://minio.internal:9000"
SECRET_ENV = {
    f"ETRAIN_SECRET_{t.upper().replace('-', '_')}_{k}": f"{t}-{k.lower()}-value"
    for t in (A, B)
    for k in ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY")
}
POLICY = {
    "policy_object_stores": {"*": ["s3://ckpt/{tenant}"]},
    "policy_endpoints": {"*": [ENDPOINT]},
}
TINY = {
    "name": "tiny",
    "resources": {"workers": 1},
    "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 4},
    "data": {"seq_len": 16, "num_samples": 32},
}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An app with the POLICY above, tokens of tenants A and B, and a recording probe."""
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASERVICEOWNKEY000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "service-own-secret")
    probed = []
    monkeypatch.setattr(storage_check, "check_storage", lambda loc, **_: probed.append(loc))
    with api_client(tmp_path, FakeBackend(cpus=4), **POLICY) as c:
        tokens = {tenant: tenant_token(c, tenant) for tenant in (A, B)}
        yield c, tokens, probed, tmp_path


def _layout(data_dir):
    """Files and links the cases name: A's checkpoints and data, B's escaping symlinks."""
    a_ckpt = data_dir / "checkpoints" / A / "j-aaaa"
    (a_ckpt / "checkpoints").mkdir(parents=True)
    a_data = data_dir / "tenants" / A
    a_data.mkdir(parents=True)
    (a_data / "corpus.txt").write_text("team a's private text\n")
    b_ckpt, b_data = data_dir / "checkpoints" / B, data_dir / "tenants" / B
    b_ckpt.mkdir(parents=True)
    b_data.mkdir(parents=True)
    os.symlink(a_ckpt, b_ckpt / "escape")
    os.symlink("/etc/passwd", b_data / "passwd")
    for name in ("admin_token", "ray_auth_token"):
        (data_dir / name).touch()
    return a_ckpt, a_data


def _storage(v):
    return {"checkpoint": {"storage": v}}


def _data(v):
    return {"data": {"source": "text", "path": v, "seq_len": 16}}


def _eval(v):
    """An evaluation source at ``v`` beside synthetic training data (its seq_len is data's)."""
    return {"data": {"eval": {"source": "text", "path": v}}}


def _mixed(v):
    """``v`` as the second of two mixed sources (the first is synthetic)."""
    sources = [{"weight": 1}, {"source": "text", "path": v, "weight": 1}]
    return {"data": {"sources": sources, "seq_len": 16}}


def _template(v, *, section="data"):
    """A chat source of the tenant's rendered with the template file at ``v``."""
    chat = {"source": "jsonl", "path": f"{D}/tenants/team-b/chat.jsonl", "shape": "chat"}
    if section == "data":
        return {"data": {**chat, "chat_template": v, "seq_len": 16}}
    return {"data": {"eval": {**chat, "chat_template": v}}}


def _s3(storage="s3://ckpt/team-b/run", **s3):
    return {"checkpoint": {"storage": storage}, **({"stores": {"s3": s3}} if s3 else {})}


STORAGE = ["checkpoint", "storage"]
DATA = ["data", "path"]
EVAL = ["data", "eval", "path"]
# (section builder, loc of its path) for each spec field that names a data file.
DATA_FIELDS = {
    "data": (_data, DATA),
    "eval": (_eval, EVAL),
    "sources": (_mixed, ["data", "sources", 1, "path"]),
}
ENDPOINT_LOC = ["stores", "s3", "endpoint_url"]
SECRET_LOC = ["stores", "s3", "credentials_secret"]
D = "{data}"  # the service's data dir, filled in per test

# (id, tenant, path, words the msg must hold): each a data.path and a data.eval.path case.
DATA_REFUSED = [
    ("item02-data-etc-shadow", B, "/etc/shadow", "system folder"),
    ("item02-data-admin-token", B, f"{D}/admin_token", "data dir"),
    ("item02-data-ray-token", B, f"{D}/ray_auth_token", "data dir"),
    ("item02-data-database", B, f"{D}/etrain.db", "data dir"),
    ("item02-data-proc-environ", B, "/proc/self/environ", "system folder"),
    ("item02-data-other-tenant", B, f"{D}/tenants/team-a/corpus.txt", "another"),
    ("item02-data-symlink-escape", B, f"{D}/tenants/team-b/passwd", "system"),
    ("item02-data-relative", B, "corpus.txt", "absolute path"),
    ("item02-data-outside", B, "/tmp/corpus.txt", "outside tenant 'team-b'"),
    ("item02-data-admin-too", "admin", f"{D}/admin_token", "data dir"),
]
# (id, tenant, spec section, loc of the refusal, words its msg must hold)
REFUSED = [
    ("item01-storage-etc", B, _storage("file:///etc"), STORAGE, "system folder"),
    ("item01-storage-root", B, _storage("file:///"), STORAGE, "no job may use"),
    ("item01-storage-proc-self", B, _storage("file:///proc/self"), STORAGE, "system folder"),
    ("item01-storage-dotdot-etc", B, _storage("file:///tmp/../etc"), STORAGE, "system folder"),
    ("item01-storage-data-dir", B, _storage(f"file://{D}"), STORAGE, "data dir"),
    ("item01-storage-tenant-root", B, _storage(f"file://{D}/checkpoints"), STORAGE, "tenant"),
    (
        "item01-storage-other-tenant",
        B,
        _storage(f"file://{D}/checkpoints/team-a/j-aaaa"),
        STORAGE,
        "another tenant's checkpoint area",
    ),
    (
        "item01-storage-dotdot-other-tenant",
        B,
        _storage(f"file://{D}/checkpoints/team-b/../team-a"),
        STORAGE,
        "another tenant's checkpoint area",
    ),
    (
        "item01-storage-symlink-escape",
        B,
        _storage(f"file://{D}/checkpoints/team-b/escape"),
        STORAGE,
        "another tenant's checkpoint area",
    ),
    ("item01-storage-elsewhere", B, _storage("file:///tmp/ckpt"), STORAGE, "outside tenant"),
    *(
        (case if name == "data" else f"{case}-eval", tenant, section(path), loc, words)
        for case, tenant, path, words in DATA_REFUSED
        for name, (section, loc) in DATA_FIELDS.items()
    ),
    # A chat template file follows the data file rule, as data.chat_template and as
    # data.eval.chat_template (a relative value is a template's name, not a file).
    *(
        (f"{case}-{where}-template", tenant, _template(path, section=where), loc, words)
        for case, tenant, path, words in DATA_REFUSED
        if path.startswith(("/", D))
        for where, loc in (
            ("data", ["data", "chat_template"]),
            ("eval", ["data", "eval", "chat_template"]),
        )
    ),
    (
        "item04-tenant-endpoint",
        B,
        _s3(endpoint_url="http://169.254.169.254", credentials_secret=B),
        ENDPOINT_LOC,
        "ETRAIN_POLICY_ENDPOINTS",
    ),
    (
        "item04-gcs-endpoint",
        B,
        {
            "checkpoint": {"storage": "gs://ckpt/team-b"},
            "stores": {"gcs": {"endpoint_url": "http://10.0.0.9"}},
        },
        ["stores", "gcs", "endpoint_url"],
        "ETRAIN_POLICY_ENDPOINTS",
    ),
    ("item04-service-own-keys", B, _s3(endpoint_url=ENDPOINT), SECRET_LOC, "service's own keys"),
    (
        "item04-unlisted-bucket",
        B,
        _s3("s3://ckpt/team-a", endpoint_url=ENDPOINT, credentials_secret=B),
        STORAGE,
        "ETRAIN_POLICY_OBJECT_STORES",
    ),
    (
        "item05-other-tenant-secret",
        B,
        _s3(endpoint_url=ENDPOINT, credentials_secret=A),
        SECRET_LOC,
        "may use; use one of: team-b",
    ),
    (
        "item05-other-tenant-secret-local-checkpoints",
        B,
        {"stores": {"s3": {"credentials_secret": A}}, "model": {"hf": "s3://ckpt/team-b/m"}},
        SECRET_LOC,
        "may use; use one of: team-b",
    ),
    (
        "item04-endpoint-for-a-model-only",
        B,
        {"stores": {"s3": {"endpoint_url": "http://169.254.169.254", "credentials_secret": B}}}
        | {"model": {"hf": "s3://ckpt/team-b/m"}},
        ENDPOINT_LOC,
        "ETRAIN_POLICY_ENDPOINTS",
    ),
]

# (id, tenant, spec section, stored checkpoint.storage or None to skip that check)
ALLOWED = [
    ("item01-default-storage-is-the-tenant-area", B, {}, f"file://{D}/checkpoints/team-b"),
    ("item01-own-area", B, _storage(f"file://{D}/checkpoints/team-b/exp"), None),
    ("item02-own-data", B, _data(f"{D}/tenants/team-b/corpus.txt"), None),
    ("item02-own-eval-data", B, _eval(f"{D}/tenants/team-b/corpus.txt"), None),
    (
        "item04-listed-store-with-own-secret",
        B,
        _s3(endpoint_url=ENDPOINT, credentials_secret=B),
        None,
    ),
    ("item01-admin-elsewhere", "admin", _storage("file:///mnt/ckpt"), "file:///mnt/ckpt"),
]


def _fill(value, data_dir):
    """``value`` with every "{data}" replaced by the data dir."""
    if isinstance(value, dict):
        return {k: _fill(v, data_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, data_dir) for v in value]
    return value.replace(D, str(data_dir)) if isinstance(value, str) else value


def _headers(tokens, tenant):
    return ADMIN_H if tenant == "admin" else tokens[tenant]


def _body(section, data_dir):
    section = _fill(section, data_dir)
    data = {**TINY["data"], **section.get("data", {})}
    if "sources" in data:  # the sources replace data's own source fields
        data.pop("num_samples")
    return {**TINY, **section, "data": data}


def refused_with(c, route: str, spec: dict, headers: dict, loc: list, words: str) -> None:
    """``spec`` posted to ``route`` (a job, or a plan of it) is a 422 whose error at ``loc``
    names that field and says ``words``, and the answer holds no secret."""
    r = c.post(route, json=spec if route == "/v1/jobs" else {"spec": spec}, headers=headers)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    mine = [e for e in errors if e["loc"] == ["body", *loc]]
    assert mine, errors
    assert words in mine[0]["msg"], mine[0]["msg"]
    field = ".".join(str(part) for part in loc)
    assert f"{field} " in mine[0]["msg"], mine[0]["msg"]  # the field, by its name
    assert not any(v in r.text for v in SECRET_ENV.values())


@pytest.mark.parametrize(
    ("case", "tenant", "section", "loc", "words"), REFUSED, ids=[r[0] for r in REFUSED]
)
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
def test_spec_access_refused(env, route, case, tenant, section, loc, words):
    c, tokens, probed, data_dir = env
    _layout(data_dir)
    spec = _body(section, data_dir)
    refused_with(c, route, spec, _headers(tokens, tenant), loc, words)
    assert probed == []  # the service sent nothing to a store it refused
    assert c.get("/v1/jobs", headers=_headers(tokens, tenant)).json()["total"] == 0


@pytest.mark.parametrize(
    ("case", "tenant", "section", "stored"), ALLOWED, ids=[a[0] for a in ALLOWED]
)
def test_spec_access_allowed(env, case, tenant, section, stored):
    c, tokens, _, data_dir = env
    spec = _body(section, data_dir)
    r = c.post("/v1/jobs", json=spec, headers=_headers(tokens, tenant))
    assert r.status_code == 201, r.text
    if stored is not None:
        assert r.json()["spec"]["checkpoint"]["storage"] == _fill(stored, data_dir)
    assert (
        c.post("/v1/plan", json={"spec": spec}, headers=_headers(tokens, tenant)).status_code == 200
    )


def test_item04_probe_uses_the_jobs_own_secret_not_the_service_keys(env):
    """The probe is sent to the operator-listed endpoint with the tenant's secret: the
    credentials the job will run with, never the service's AWS_* keys."""
    c, tokens, probed, _ = env
    spec = {**TINY, **_s3(endpoint_url=ENDPOINT, credentials_secret=B)}
    assert c.post("/v1/jobs", json=spec, headers=tokens[B]).status_code == 201
    (loc,) = probed
    assert loc.endpoint_url == ENDPOINT
    assert loc.options["key"] == SECRET_ENV["ETRAIN_SECRET_TEAM_B_ACCESS_KEY_ID"]
    assert "ETRAIN_SECRET_TEAM_B" in loc.credentials_source
    assert "AKIASERVICEOWNKEY000" not in repr(loc.options)


# --- specs written before the stores section ------------------------------------------------
# checkpoint.s3 / checkpoint.gcs are still accepted: moved to stores.s3 / stores.gcs before
# validation, stored in that form, and held to the same policy.

GS_ENDPOINT = "https://gcs.internal"
OLD_FORM = {
    "s3": ("s3://ckpt/team-b/run", {"endpoint_url": ENDPOINT, "credentials_secret": B}),
    "gcs": ("gs://ckpt/team-b/run", {"endpoint_url": GS_ENDPOINT}),
}


@pytest.fixture
def gs_env(monkeypatch, request):
    """:func:`env` whose policy also lists gs://ckpt/<tenant> and GS_ENDPOINT, with the
    probe's resolution recorded (no Google credentials are looked up)."""
    import sys

    me = sys.modules[__name__]
    monkeypatch.setattr(
        me,
        "POLICY",
        {
            "policy_object_stores": {"*": ["s3://ckpt/{tenant}", "gs://ckpt/{tenant}"]},
            "policy_endpoints": {"*": [ENDPOINT, GS_ENDPOINT]},
        },
    )
    resolved = []

    def resolve(uri, stores, **_):
        resolved.append((uri, stores))
        return uri

    monkeypatch.setattr(storage_check, "resolve_store", resolve)
    c, tokens, _, data_dir = request.getfixturevalue("env")
    return c, tokens, resolved, data_dir


def _old_form(name: str, **options) -> dict:
    storage, given = OLD_FORM[name]
    return {**TINY, "checkpoint": {"storage": storage, name: {**given, **options}}}


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_old_form_is_accepted_and_stored_in_the_new_form(gs_env, name):
    c, tokens, resolved, _ = gs_env
    spec = _old_form(name)
    r = c.post("/v1/jobs", json=spec, headers=tokens[B])
    assert r.status_code == 201, r.text
    for stored in (
        r.json()["spec"],
        c.get(f"/v1/jobs/{r.json()['id']}", headers=tokens[B]).json()["spec"],
    ):
        assert name not in stored["checkpoint"]
        assert stored["stores"][name]["endpoint_url"] == spec["checkpoint"][name]["endpoint_url"]
    ((uri, stores),) = resolved  # the probe reached the store with the moved options
    assert uri == spec["checkpoint"]["storage"]
    assert getattr(stores, name).endpoint_url == spec["checkpoint"][name]["endpoint_url"]
    plan = c.post("/v1/plan", json={"spec": spec}, headers=tokens[B])
    assert plan.status_code == 200, plan.text


@pytest.mark.parametrize("name", ["s3", "gcs"])
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
def test_old_form_endpoint_is_held_to_the_policy(gs_env, route, name):
    c, tokens, resolved, _ = gs_env
    spec = _old_form(name, endpoint_url="http://169.254.169.254")
    loc = ["stores", name, "endpoint_url"]
    refused_with(c, route, spec, tokens[B], loc, "ETRAIN_POLICY_ENDPOINTS")
    assert resolved == []


def test_old_form_secret_is_held_to_the_policy(gs_env):
    c, tokens, resolved, _ = gs_env
    spec = _old_form("s3", credentials_secret=A)
    refused_with(c, "/v1/jobs", spec, tokens[B], SECRET_LOC, "may use; use one of: team-b")
    assert resolved == []


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_old_and_new_form_that_differ_are_refused_naming_both(gs_env, name):
    c, tokens, _, _ = gs_env
    spec = {**_old_form(name), "stores": {name: {"endpoint_url": "http://other:1"}}}
    r = c.post("/v1/jobs", json=spec, headers=tokens[B])
    assert r.status_code == 422, r.text
    assert f"checkpoint.{name}" in r.text and f"stores.{name}" in r.text
    same = {**_old_form(name), "stores": {name: OLD_FORM[name][1]}}
    assert c.post("/v1/jobs", json=same, headers=tokens[B]).status_code == 201
