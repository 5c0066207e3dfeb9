"""model.hf on an object store, service side: credentials for every store a spec names go
to its workers, and the submit-time config.json read runs in a probe thread whose failures
are 422s naming model.hf (the reads against a real S3 server are in
tests/integration/test_hf_object_store.py)."""

from __future__ import annotations

import threading

import pytest

from service.domain import model_source
from service.domain.model_source import check_model
from service.domain.storage_check import StorageProbes, storage_launch_env
from service.errors import InvalidSpec
from service.k8s.pod_security import storage_env_names, tenant_storage_env
from tests.support.fakes import FakeBackend
from tests.support.hf_fixtures import hf_config
from tests.unit.service.test_storage_check import AWS, NAMED, OTHER
from workers.spec import JobSpec
from workers.storage.credentials import AWS_ENV
from workers.storage.location import job_credential_env, job_store_uris

ENV = {**AWS, **NAMED, **OTHER}


def _spec(
    hf: str | None = None, checkpoint: dict | None = None, stores: dict | None = None, **data
) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "j",
            "model": {"hf": hf} if hf else {},
            "data": {"seq_len": 16, "num_samples": 8, **data},
            "train": {"global_batch_size": 2, "micro_batch_size": 2},
            "resources": {"workers": 1},
            "checkpoint": checkpoint or {"storage": "file:///shared/ckpt"},
            "stores": stores or {},
        }
    )


@pytest.mark.parametrize(
    ("hf", "checkpoint", "stores", "expected"),
    [
        ("s3://models/llama", None, None, AWS),  # local checkpoints, model in S3: AWS_* go
        (
            "s3://models/llama",
            {"storage": "s3://ckpts/jobs"},
            {"s3": {"credentials_secret": "minio"}},
            NAMED,
        ),
        # The secret serves every s3:// path, whatever checkpoint.storage is.
        ("s3://models/llama", None, {"s3": {"credentials_secret": "minio"}}, NAMED),
        ("gs://models/llama", None, None, {}),
        ("/data/llama", None, None, {}),
    ],
    ids=["s3-model-file-ckpt", "named-secret", "named-secret-file-ckpt", "gs", "local"],
)
def test_the_workers_get_the_credentials_of_every_store_the_spec_names(
    hf, checkpoint, stores, expected
):
    spec = _spec(hf, checkpoint, stores)
    assert job_credential_env(spec, env=ENV) == expected
    assert storage_launch_env(spec, env=ENV) == expected
    names = storage_env_names(spec)
    assert set(names) == set(expected) | ({"AWS_SESSION_TOKEN"} if expected == AWS else set()) | (
        {"ETRAIN_SECRET_MINIO_SESSION_TOKEN"} if expected == NAMED else set()
    )
    assert [e["name"] for e in tenant_storage_env("acme", spec)] == list(names)


def test_data_path_and_tokenizer_count_too():
    spec = _spec(None, None, None, path="s3://data/rows.jsonl", source="jsonl")
    assert job_store_uris(spec) == ["file:///shared/ckpt", "s3://data/rows.jsonl"]
    assert storage_env_names(spec) == AWS_ENV


@pytest.mark.parametrize(
    ("stores", "expected"),
    [(None, AWS), ({"s3": {"credentials_secret": "minio"}}, NAMED)],
    ids=["aws", "named-secret"],
)
def test_the_evaluation_source_counts_too(stores, expected):
    """An s3:// data.eval.path beside local training data and checkpoints: its store's
    credentials reach the workers and the pods like data.path's."""
    held_out = {"source": "jsonl", "path": "s3://data/eval.jsonl"}
    spec = _spec(None, None, stores, eval=held_out)
    assert job_store_uris(spec) == ["file:///shared/ckpt", "s3://data/eval.jsonl"]
    assert job_credential_env(spec, env=ENV) == expected
    assert storage_launch_env(spec, env=ENV) == expected
    names = storage_env_names(spec)
    assert set(expected) <= set(names) and not set(names) & (set(ENV) - set(expected))
    assert [e["name"] for e in tenant_storage_env("acme", spec)] == list(names)
    both = _spec(None, None, stores, path="s3://data/rows.jsonl", source="jsonl", eval=held_out)
    assert job_store_uris(both)[1:] == ["s3://data/rows.jsonl", "s3://data/eval.jsonl"]
    local = _spec(None, None, None, eval={"source": "jsonl", "path": "/data/eval.jsonl"})
    assert storage_env_names(local) == () and job_credential_env(local, env=ENV) == {}


def test_the_reconciler_forwards_them_for_a_model_in_s3(tmp_path, monkeypatch):
    from service.domain.reconciler import Reconciler
    from service.settings import Settings
    from service.store import Stores, migrate

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path / 'etrain.db'}"
    migrate(url)
    stores = Stores.open(url)
    try:
        spec = _spec("s3://models/llama")
        tenant = stores.tokens.create_tenant("acme").id
        stores.jobs.create_job(tenant_id=tenant, name="j", spec=spec, min_workers=1)
        backend = FakeBackend(cpus=4)
        Reconciler(
            stores, backend, Settings(env="development", data_dir=tmp_path).reconciler
        ).tick()
        (req,) = backend.submitted
        env = req.env
    finally:
        stores.close()
    assert {k: v for k, v in env.items() if k.startswith(("AWS_", "ETRAIN_SECRET_"))} == AWS


# --- the config.json read at submit ---------------------------------------------------------


def _refusal(spec: JobSpec, probes: StorageProbes) -> str:
    with pytest.raises(InvalidSpec) as info:
        check_model(spec, probes=probes, tenant="acme")
    (item,) = info.value.errors
    assert item["loc"] == ["body", "model", "hf"]
    return item["msg"]


def test_a_store_that_does_not_answer_is_a_422_in_time(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(model_source, "read_remote_model", lambda spec, t: release.wait(5))
    probes = StorageProbes(workers=2, per_tenant=2, timeout_s=0.2)
    try:
        msg = _refusal(_spec("s3://models/llama"), probes)
    finally:
        release.set()
    assert "did not answer within 0.2 s" in msg and "ETRAIN_PROBE_TIMEOUT_S" in msg


def test_a_half_set_key_pair_is_a_422_naming_the_variables(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAHALF000000000001")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    probes = StorageProbes(workers=2, per_tenant=2, timeout_s=5)
    msg = _refusal(_spec("s3://models/llama"), probes)
    assert msg.startswith("model.hf s3://models/llama") and "AWS_SECRET_ACCESS_KEY" in msg
    assert "AKIAHALF000000000001" not in msg


def test_the_config_read_maps_and_checks_the_layout(monkeypatch):
    config = hf_config("llama").to_json_string().encode()
    monkeypatch.setattr(model_source, "read_remote_model", lambda spec, t: (config, True))
    probes = StorageProbes(workers=2, per_tenant=2, timeout_s=5)
    cfg = check_model(_spec("gs://models/llama"), probes=probes, tenant="acme")
    assert cfg is not None and cfg.dim == hf_config("llama").hidden_size
    too_long = _spec("gs://models/llama", None)
    too_long = too_long.model_copy(
        update={"data": too_long.data.model_copy(update={"seq_len": 1 << 20})}
    )
    assert "model.hf (llama)" in _refusal(too_long, probes)


def _reference_folder(path, **config) -> str:
    """A model folder as the submit check reads it: config.json and a weights file."""
    path.mkdir(parents=True, exist_ok=True)
    hf_config("llama", **config).to_json_file(str(path / "config.json"))
    (path / "model.safetensors").write_bytes(b"{}")
    return str(path)


def test_a_dpo_reference_folder_is_checked_at_submit(tmp_path):
    from service.domain.model_source import check_reference
    from workers.models.config import get_model_config

    vocab = get_model_config("gpt-tiny").vocab_size

    def spec(reference: str) -> JobSpec:
        return JobSpec.model_validate(
            {
                "name": "j",
                "objective": "dpo",
                "dpo": {"reference": reference},
                "model": {"preset": "gpt-tiny"},
                "data": {"source": "jsonl", "path": "/d/p.jsonl", "shape": "preference"},
            }
        )

    check_reference(spec(_reference_folder(tmp_path / "same", vocab_size=vocab)), None)
    check_reference(spec("s3://bucket/ref"), None)  # the workers read an object-store one
    other = _reference_folder(tmp_path / "other", vocab_size=vocab + 128)
    for folder, said in (
        (other, f"a vocabulary of {vocab + 128} tokens, the trained model {vocab}"),
        (str(tmp_path / "missing"), "is not a folder the service can see"),
        (str(tmp_path), "has no config.json"),
    ):
        with pytest.raises(InvalidSpec) as e:
            check_reference(spec(folder), None)
        (error,) = e.value.errors
        assert error["loc"] == ["body", "dpo", "reference"]
        assert error["msg"].startswith(f"dpo.reference {folder}") and said in error["msg"]
