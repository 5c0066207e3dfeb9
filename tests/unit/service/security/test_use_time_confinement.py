"""Files inside an allowed folder are untrusted too: the security table for what the service
reads at submit and plan.

The access policy allows tenant A's folders. A then plants, inside them, a config.json
that links to tenant B's, a weight map naming files outside the folder, a prepared
folder whose index.json is a named pipe, a 1.5 GiB sparse file or a link to B's index.
Each is a 422 naming the field, within seconds, on submit and on plan, saying nothing of
B's files; the API keeps answering meanwhile.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests.support.api import api_client, tenant_token
from tests.support.fakes import FakeBackend
from tests.support.hf_fixtures import hf_config

A, B = "team-a", "team-b"
B_HEADS = 24  # tenant B's config: a head count nobody else uses
B_SEQ = 4093  # tenant B's prepared data: a seq_len nobody else uses


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One app for the table: tenant A's token; A's and B's data areas."""
    root = tmp_path_factory.mktemp("svc")
    areas = {t: root / "tenants" / t for t in (A, B)}
    for t, area in areas.items():
        (area / "m").mkdir(parents=True)
        heads = B_HEADS if t == B else 4
        hf_config(
            num_attention_heads=heads, num_key_value_heads=heads, hidden_size=96
        ).to_json_file(area / "m" / "config.json")
        (area / "m" / "model.safetensors").write_bytes(b"")
        (area / "prepared").mkdir()
        (area / "prepared" / "index.json").write_text(
            json.dumps({"format_version": 1, "seq_len": B_SEQ if t == B else 16, "files": {}})
        )
    with api_client(root, FakeBackend(cpus=4)) as c:
        yield c, tenant_token(c, A), areas


def _body(*, hf: str | None = None, data: str | None = None) -> dict:
    body = {
        "name": "m",
        "data": {"seq_len": 16, "num_samples": 8},
        "resources": {"workers": 1},
        "train": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 2},
    }
    if hf:
        body["model"] = {"hf": hf}
    if data:
        body["data"] = {"source": "prepared", "path": data, "seq_len": 16}
    return body


def _fresh(area, name):
    """A new folder in A's area for one case (the table shares the app)."""
    folder = area / name
    folder.mkdir()
    return folder


def config_link(areas):
    folder = _fresh(areas[A], "config-link")
    (folder / "config.json").symlink_to(areas[B] / "m" / "config.json")
    (folder / "model.safetensors").write_bytes(b"")
    return _body(hf=str(folder)), ("model", "hf")


def weight_map_absolute(areas):
    folder = _fresh(areas[A], "abs-map")
    hf_config().to_json_file(folder / "config.json")
    index = {"weight_map": {"lm_head.weight": str(areas[B] / "m" / "model.safetensors")}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return _body(hf=str(folder)), ("model", "hf")


def weight_map_dotdot(areas):
    folder = _fresh(areas[A], "dotdot-map")
    hf_config().to_json_file(folder / "config.json")
    index = {"weight_map": {"lm_head.weight": f"../../{B}/m/model.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return _body(hf=str(folder)), ("model", "hf")


def index_fifo(areas):
    folder = _fresh(areas[A], "fifo")
    os.mkfifo(folder / "index.json")
    return _body(data=str(folder)), ("data", "path")


def index_sparse(areas):
    folder = _fresh(areas[A], "sparse")
    with open(folder / "index.json", "wb") as f:
        f.truncate(3 << 29)  # 1.5 GiB of nothing
    return _body(data=str(folder)), ("data", "path")


def index_link(areas):
    folder = _fresh(areas[A], "index-link")
    (folder / "index.json").symlink_to(areas[B] / "prepared" / "index.json")
    return _body(data=str(folder)), ("data", "path")


CASES = [config_link, weight_map_absolute, weight_map_dotdot, index_fifo, index_sparse, index_link]


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_a_trick_inside_an_allowed_folder_is_a_422_that_tells_nothing(env, case, route):
    c, h, areas = env
    # each case makes its own folder: one per (case, route)
    areas = {**areas, A: areas[A] / f"{case.__name__}-{route.rsplit('/', 1)[-1]}"}
    areas[A].mkdir()
    body, field = case(areas)
    started = time.monotonic()
    r = c.post(route, json=body if route == "/v1/jobs" else {"spec": body}, headers=h)
    assert time.monotonic() - started < 10, "a pipe or a huge file must not be read"
    assert r.status_code == 422, r.text
    items = r.json()["detail"]
    assert any(i["loc"] == ["body", *field] for i in items), items
    text = r.text.replace(str(areas[A]), "")
    assert not re.search(rf"\b({B_HEADS}|{B_SEQ})\b", text), text  # nothing of B's files
    assert c.get("/healthz").status_code == 200
    if case is index_sparse:  # refused by its size, before a byte is read
        assert "over the 16777216-byte limit" in text, text


def test_the_same_folders_without_the_trick_pass(env, tmp_path):
    c, h, areas = env
    folder = areas[A] / "plain-prepared"
    folder.mkdir()
    (folder / "index.json").write_text(
        json.dumps({"format_version": 1, "seq_len": 16, "files": {}})
    )
    (areas[A] / "inner").symlink_to("m")  # a link that stays inside A's area
    for body in (_body(hf=str(areas[A] / "inner")), _body(data=str(folder))):
        r = c.post("/v1/plan", json={"spec": body}, headers=h)
        assert r.status_code == 200, r.text
