"""model.hf at submit and plan: config.json read by the service, 422s naming model.hf
with the fix, the real shape in the plan."""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings
from tests.support.hf_fixtures import hf_config

TENANT = "team-a"


@pytest.fixture
def app(tmp_path):
    """An app, a tenant token and the tenant's data area."""
    with TestClient(
        create_app(dev_settings(tmp_path), backend=FakeBackend(cpus=4), reconcile=False)
    ) as c:
        r = c.post("/v1/tokens", json={"tenant": TENANT}, headers=ADMIN_H)
        assert r.status_code == 201, r.text
        area = tmp_path / "tenants" / TENANT
        area.mkdir(parents=True)
        yield c, {"Authorization": f"Bearer {r.json()['token']}"}, area


def _folder(area, name="tiny", *, weights=True, **config):
    folder = area / name
    folder.mkdir()
    hf_config(**config).to_json_file(folder / "config.json")
    if weights:
        (folder / "model.safetensors").write_bytes(b"")  # the service does not read weights
    return folder


def _spec(hf, workers=2, **par):
    return {
        "name": "ft",
        "model": {"hf": str(hf), "lora": {"rank": 4}, "activation_checkpointing": "selective"},
        "data": {"seq_len": 32, "num_samples": 16},
        "resources": {"workers": workers},
        "parallelism": par or {"strategy": "ddp"},
        "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2},
    }


def test_the_plan_has_the_models_real_shape(app):
    c, h, area = app
    folder = _folder(area, hidden_size=96, num_hidden_layers=3, num_attention_heads=6)
    r = c.post("/v1/plan", json={"spec": _spec(folder)}, headers=h)
    assert r.status_code == 200, r.text
    plan = r.json()
    # 3 layers of width 96 (6 heads of 16, 2 KV heads), 384-token vocabulary, untied
    per_layer = 2 * 96 * 96 + 2 * 96 * 32 + 3 * 96 * 128 + 2 * 96
    assert plan["num_params"] == 3 * per_layer + 2 * 384 * 96 + 96
    assert plan["breakdown"]["activation_checkpointing"] == "selective"
    assert plan["breakdown"]["lora_trainable_params"] == 3 * 4 * (2 * (96 + 96) + 2 * (96 + 32))
    assert c.post("/v1/jobs", json=_spec(folder), headers=h).status_code == 201


def _refused(c, h, body, *words):
    for route, data in (("/v1/jobs", body), ("/v1/plan", {"spec": body})):
        r = c.post(route, json=data, headers=h)
        assert r.status_code == 422, (route, r.text)
        item = r.json()["detail"][0]
        assert item["loc"][-2:] == ["model", "hf"], item
        for w in words:
            assert w in item["msg"], (w, item["msg"])


def test_no_folder_no_config_no_weights(app):
    c, h, area = app
    _refused(c, h, _spec(area / "absent"), "not a folder", "config.json")
    (area / "empty").mkdir()
    _refused(c, h, _spec(area / "empty"), "no config.json", "save_pretrained")
    _refused(c, h, _spec(_folder(area, weights=False)), "no weights", "model.safetensors")


def test_a_fifo_named_config_json_does_not_hang_the_request(app):
    c, h, area = app
    (area / "fifo").mkdir()
    os.mkfifo(area / "fifo" / "config.json")
    _refused(c, h, _spec(area / "fifo"), "no config.json")


def test_unsupported_architecture_lists_the_supported_ones(app):
    c, h, area = app
    folder = _folder(area, architectures=["GPT2LMHeadModel"])
    _refused(c, h, _spec(folder), "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM")
    (area / "junk").mkdir()
    (area / "junk" / "config.json").write_text("{not json")
    _refused(c, h, _spec(area / "junk"), "not valid JSON")
    (area / "big").mkdir()
    (area / "big" / "config.json").write_bytes(b" " * (2 << 20))
    _refused(c, h, _spec(area / "big"), "bytes")


def test_a_layout_that_does_not_fit_the_model(app):
    c, h, area = app
    folder = _folder(area, num_attention_heads=4, num_key_value_heads=2)
    wide = _spec(folder, 4, strategy="tp", tp=4)
    del wide["model"]["lora"]
    _refused(c, h, wide, "parallelism.tp (4)", "KV heads")
    deep = _folder(area, "deep", num_hidden_layers=2)
    body = _spec(
        deep, strategy="pp", pp=2, pipeline={"microbatches": 2, "schedule": "interleaved_1f1b"}
    )
    del body["model"]["lora"]
    _refused(c, h, body, "pipeline stages", "parallelism.pp")
    long = _spec(folder)
    long["data"]["seq_len"] = 256
    _refused(c, h, long, "data.seq_len (256)")


def test_an_object_store_model_folder_is_refused_with_the_fix(app, monkeypatch):
    c, h, _ = app
    r = c.post("/v1/jobs", json=_spec("s3://models/llama"), headers=h)
    assert r.status_code == 422
    assert "model.hf" in r.text and "ETRAIN_POLICY_OBJECT_STORES" in r.text
