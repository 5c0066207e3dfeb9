"""model.hf on an object store (moto S3 on loopback): the workers read a sharded Hugging
Face folder from s3:// by byte range and train exactly as from the local folder under FSDP
and TP; a rank under FSDP fetches less than the whole model (DDP, which replicates it,
fetches it all); the service reads config.json from the store at submit and plan, and
refuses a prefix without config.json, without weights, of an unsupported architecture or
in a missing bucket with a 422 naming model.hf; an export copies config and tokenizer
files from the store."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from tests.support.fakes import ADMIN_H
from tests.support.hf_fixtures import hf_config, make_hf_folder
from tests.support.local_launch import LocalJob, join_group, rendezvous, run_local
from tests.support.s3_fixture import s3_client
from workers.spec import JobSpec
from workers.storage.location import locate

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

PREFIX = "models/qwen2"


@pytest.fixture(scope="module")
def store(s3_server, tmp_path_factory):
    """A sharded tiny Qwen2 (with tokenizer) locally and under s3://bucket/models/qwen2, plus
    broken prefixes; the checkpoint section that reaches the store; AWS env set."""
    root = tmp_path_factory.mktemp("hfstore")
    local = root / "qwen2"
    make_hf_folder(local, "qwen2", seed=5, max_shard_size="40KB")
    assert (local / "model.safetensors.index.json").is_file()
    env, bucket = s3_server["env"], s3_server["bucket"]
    client = s3_client(s3_server)
    for p in local.iterdir():
        client.upload_file(str(p), bucket, f"{PREFIX}/{p.name}")
    shard = next(local.glob("model-*.safetensors"))
    client.upload_file(str(shard), bucket, "models/noconfig/model.safetensors")
    client.put_object(Bucket=bucket, Key="models/noweights/config.json",
                      Body=hf_config("qwen2").to_json_string().encode())  # fmt: skip
    gpt2 = {**json.loads(hf_config("llama").to_json_string()), "architectures": ["GPT2LMHeadModel"]}
    client.put_object(Bucket=bucket, Key="models/gpt2/config.json", Body=json.dumps(gpt2).encode())
    client.upload_file(str(shard), bucket, "models/gpt2/model.safetensors")
    sections = {  # the spec's checkpoint and stores
        "checkpoint": {"storage": f"s3://{bucket}/ck"},
        "stores": {
            "s3": {"endpoint_url": s3_server["endpoint_url"], "region": s3_server["region"]}
        },
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    weights = sum(p.stat().st_size for p in local.glob("*.safetensors"))
    yield {"local": local, "url": f"s3://{bucket}/{PREFIX}", "bucket": bucket,
           "sections": sections, "weights_bytes": weights}  # fmt: skip
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _spec(hf: str, sections: dict, parallelism: dict, workers: int = 2) -> dict:
    spec = {
        "name": "hf-s3",
        "model": {"hf": hf},
        "data": {"seq_len": 16, "num_samples": 64},
        "train": {
            "steps": 2,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-2,
            "optimizer": "sgd",
            "warmup_steps": 1,
        },
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": parallelism,
        **sections,
    }
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


LAYOUTS = {"fsdp2": {"strategy": "fsdp"}, "tp2": {"strategy": "tp", "tp": 2}}


def test_fsdp_and_tp_train_from_s3_like_from_the_local_folder(store):
    jobs = [
        LocalJob(f"{name}-{where}", _spec(str(src), store["sections"], par))
        for name, par in LAYOUTS.items()
        for where, src in (("local", store["local"]), ("s3", store["url"]))
    ]
    results = run_local(jobs, world_size=2)
    for name in LAYOUTS:
        local, remote = results[f"{name}-local"], results[f"{name}-s3"]
        assert local.error is None and remote.error is None, local.error or remote.error
        assert set(remote.losses) == {1, 2}
        assert remote.losses == local.losses, name  # the same bytes, the same losses


# --- bytes each rank fetches ------------------------------------------------------------


def _fetch_worker(rank: int, world: int, port: int, specs: dict, out: str) -> None:
    import torch.distributed as dist

    from workers.build import load_hf, new_model, split_and_apply
    from workers.models import hf_remote
    from workers.strategies.mesh import build_mesh
    from workers.train_loop import RunEnv

    fetched = [0]
    original = hf_remote.RemoteWeights._fetch

    def counting(self, path, start, end):  # a recording wrapper around every ranged read
        data = original(self, path, start, end)
        fetched[0] += len(data)
        return data

    hf_remote.RemoteWeights._fetch = counting
    join_group(rank, world, port)
    env = RunEnv(rank=rank, world_size=world, device=torch.device("cpu"))
    record = {}
    for name, data in specs.items():
        spec = JobSpec.model_validate(data)
        fetched[0] = 0
        model, cfg = new_model(spec, env)
        mesh = build_mesh(spec, world_size=world, device=env.device)
        if spec.parallelism.strategy == "ddp":
            parts = [model]
        else:
            parts, _ = split_and_apply(spec, env, model, mesh)
        load_hf(spec, env, parts, cfg)
        record[name] = fetched[0]
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def test_a_rank_under_fsdp_fetches_less_than_the_whole_model(store):
    import torch.multiprocessing as mp

    specs = {
        name: _spec(store["url"], store["sections"], par)
        for name, par in {"fsdp": {"strategy": "fsdp"}, "ddp": {"strategy": "ddp"}}.items()
    }
    rdv = rendezvous(2)  # its port stays bound until the processes end
    port = rdv.port
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_fetch_worker, args=(2, port, specs, out), nprocs=2, join=True,
                           start_method="spawn")  # fmt: skip
        per_rank = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    whole = store["weights_bytes"]
    print(f"\nwhole model {whole} bytes; fetched per rank: {per_rank}")
    for rec in per_rank:
        assert 0 < rec["fsdp"] < 0.75 * whole
        assert rec["ddp"] > 0.95 * whole  # the layout replicates it: every rank reads it all


# --- the service: config.json read at submit and plan -------------------------------------


def _body(store, prefix: str) -> dict:
    return {
        "name": "m",
        "model": {"hf": f"s3://{store['bucket']}/{prefix}"},
        "data": {"seq_len": 16, "num_samples": 8},
        "resources": {"workers": 1},
        "train": {"steps": 1, "global_batch_size": 2, "micro_batch_size": 2},
        **store["sections"],
    }


def test_submit_reads_config_json_from_the_store(store, client):
    r = client.post("/v1/plan", json={"spec": _body(store, PREFIX)}, headers=ADMIN_H)
    assert r.status_code == 200, r.text
    from workers.models.config import count_params
    from workers.models.hf_load import hf_model_config

    assert r.json()["num_params"] == count_params(hf_model_config(str(store["local"])))
    r = client.post("/v1/jobs", json=_body(store, PREFIX), headers=ADMIN_H)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("prefix", "words"),
    [
        ("models/noconfig", "has no config.json"),
        ("models/noweights", "has no weights"),
        ("models/gpt2", "LlamaForCausalLM"),  # unsupported: the message lists what is
        ("models/absent", "has no config.json"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plan"])
def test_a_bad_prefix_is_a_422_naming_model_hf(store, client, prefix, words, route):
    body = _body(store, prefix)
    r = client.post(route, json=body if route == "/v1/jobs" else {"spec": body}, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "model", "hf"] and words in item["msg"], item
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in r.text


def test_a_missing_bucket_is_a_422_that_says_so(store, client):
    body = _body(store, "models/qwen2")
    body["model"]["hf"] = "s3://no-such-bucket/models/qwen2"
    r = client.post("/v1/plan", json={"spec": body}, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "model", "hf"] and "does not exist" in item["msg"], item


# --- export ---------------------------------------------------------------------------


def test_export_copies_config_and_tokenizer_from_the_store(store, tmp_path):
    from workers.checkpoint.export_hf import copy_tokenizer_files, source_hf_config
    from workers.spec import StoresSpec

    section = StoresSpec.model_validate(store["sections"]["stores"])
    copied = copy_tokenizer_files(store["url"], tmp_path, section)
    assert "tokenizer.json" in copied
    for name in copied:
        assert (tmp_path / name).read_bytes() == (store["local"] / name).read_bytes()
    config = source_hf_config(store["url"], dtype=torch.float32, stores=section)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is False


# --- both stores: S3 (moto) and GCS (emulator) ------------------------------------------


def test_each_store_gives_the_same_weights_and_config(object_store, store):
    from service.domain.model_source import read_remote_model
    from workers.models.hf_load import LocalWeights, hf_model_config, load_pretrained, materialize
    from workers.models.hf_remote import RemoteWeights, model_location
    from workers.models.llama import build_model
    from workers.storage.location import resolve_store

    loc = object_store.location("hf", "qwen2")
    for p in store["local"].iterdir():
        loc.fs.put_file(str(p), loc.join(p.name))
    url = object_store.uri("hf", "qwen2")
    section = object_store.stores_spec()

    def stores(uri):
        return resolve_store(uri, section, env=object_store.env)

    cfg = hf_model_config(url, stores)
    assert cfg == hf_model_config(str(store["local"]))
    models = []
    for weights in (LocalWeights(str(store["local"])), RemoteWeights(model_location(url, stores))):
        model = build_model(cfg, seed=0, device="meta")
        materialize(model, device="cpu")
        load_pretrained([model], url, cfg, weights=weights)
        models.append(model.state_dict())
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    spec = JobSpec.model_validate(_spec(url, object_store.sections("ck"), {"strategy": "ddp"}, 1))
    text, has_weights = read_remote_model(spec, 10.0)  # the service's submit-time read
    assert has_weights and text == (store["local"] / "config.json").read_bytes()


# --- exports of a job whose base is in the store -------------------------------------------

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _train(store, out: Path, lora: dict | None = None):
    """One process from the s3:// folder, checkpoints under ``out``: (model, newest step)."""
    from workers.train_loop import RunEnv, run

    sections = store["sections"]
    sections = {**sections, "checkpoint": {**sections["checkpoint"], "every_steps": 2}}
    spec = _spec(store["url"], sections, {"strategy": "ddp"}, 1)
    if lora:
        spec["model"]["lora"] = lora
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(out))
    res = run(JobSpec.model_validate(spec), env)
    step_dir = sorted(p for p in out.iterdir() if p.name.startswith("step_"))[-1]
    return res.model.eval(), step_dir


def test_exports_of_a_job_from_s3_read_config_tokenizer_and_base_there(store, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from workers.checkpoint.export import export_checkpoint
    from workers.checkpoint.export_lora import export_adapter, export_merged
    from workers.models.hf_load import hf_model_config
    from workers.spec import StoresSpec

    section = StoresSpec.model_validate(store["sections"]["stores"])
    vocab = hf_model_config(str(store["local"])).vocab_size
    tokens = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))

    def logits(model):
        with torch.no_grad():
            out = model(tokens)
        return getattr(out, "logits", out)

    trained, step_dir = _train(store, tmp_path / "full")
    export_checkpoint(step_dir, tmp_path / "out", hf=store["url"], store=section)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    torch.testing.assert_close(logits(hf), logits(trained), atol=1e-5, rtol=1e-5)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (store["local"] / name).read_bytes()

    trained, step_dir = _train(store, tmp_path / "lora", LORA)
    export_adapter(step_dir, tmp_path / "adapter", lora=LORA, store=section)
    base = AutoModelForCausalLM.from_pretrained(store["local"], dtype=torch.float32)
    before = logits(base)
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    assert (logits(trained) - before).abs().max() > 1e-3  # the adapters changed the output
    torch.testing.assert_close(logits(peft_model), logits(trained), atol=1e-5, rtol=1e-5)
    export_merged(step_dir, tmp_path / "merged", lora=LORA, store=section)  # base copied here
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    torch.testing.assert_close(logits(merged.eval()), logits(trained), atol=1e-5, rtol=1e-5)
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
