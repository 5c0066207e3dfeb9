"""Export a real gpt-tiny checkpoint (saved by the train loop) to safetensors and load it back.

Every test that reads a checkpoint runs against each store: a local folder and
S3 (moto's server on loopback), where export reads the objects in place.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tests.support.local_launch import LocalJob, run_local
from workers.checkpoint.export import (
    ExportError,
    ExportSource,
    export_checkpoint,
    open_checkpoint_dir,
)
from workers.checkpoint.manager import MANIFEST, CheckpointManager
from workers.models.config import get_model_config
from workers.models.hf_naming import from_hf_state_dict, to_hf_name
from workers.models.llama import apply_rotary_emb, build_model
from workers.spec import CheckpointSpec, JobSpec, StoresSpec
from workers.storage.location import StorageLocation, locate, resolve_storage
from workers.train_loop import RunEnv, run

CFG = get_model_config("gpt-tiny")
TOKENS = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class Store:
    """Where a test's checkpoints live: a local folder, or a prefix of the S3 test bucket."""

    kind: str  # "file", "s3" or "gs"
    base: str  # URI the runs' checkpoint folders go under
    endpoint_url: str | None = None
    env: dict | None = None  # the credential variables the store needs (None: os.environ)

    def location(self, *parts: str) -> StorageLocation:
        return resolve_storage(
            "/".join([self.base, *parts]), endpoint_url=self.endpoint_url, env=self.env
        )

    def open(self, uri: str) -> ExportSource:
        spec = self.spec()
        return open_checkpoint_dir(
            uri, checkpoint=spec.checkpoint, stores=spec.stores, env=self.env
        )

    def spec(self, **resources) -> JobSpec:
        checkpoint = {"every_steps": 2, "keep_last": 3, "storage": self.base}
        stores = {}
        if self.endpoint_url:
            stores["gcs" if self.kind == "gs" else "s3"] = {"endpoint_url": self.endpoint_url}
        return JobSpec.model_validate(
            {
                "name": "export",
                "data": {"seq_len": 16, "num_samples": 64},
                "resources": resources or {"workers": 1},
                "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
                "checkpoint": checkpoint,
                "stores": stores,
            }
        )

    def train_single(self):
        """One process trains ``spec()`` with checkpoints under ``single/checkpoints``:
        (its result, step -> URI of the committed checkpoints, which are steps 2 and 4)."""
        result = run(
            self.spec(),
            RunEnv(
                rank=0,
                world_size=1,
                device=torch.device("cpu"),
                checkpoints=self.location("single", "checkpoints"),
            ),
        )
        uris = self.committed("single/checkpoints")
        assert sorted(uris) == [2, 4]
        return result, uris

    def committed(self, name: str) -> dict[int, str]:
        """Step -> URI of the committed checkpoints under ``name`` (the layout's own listing)."""
        ckpts = CheckpointManager(self.location(name), keep_last=None, rank=0).committed()
        return {c.step: c.uri for c in ckpts}


@pytest.fixture(scope="module", params=["file", "s3"])
def store(request, tmp_path_factory):
    """Each store, with its credentials in os.environ while the module's tests run (the train
    loop and its spawned ranks read them there; export is given them explicitly)."""
    if request.param == "file":
        yield Store("file", f"file://{tmp_path_factory.mktemp('ckpts')}")
        return
    s3 = request.getfixturevalue("s3_server")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3["env"].items():
            mp.setenv(key, value)
        yield Store(
            "s3",
            f"s3://{s3['bucket']}/export-{uuid.uuid4().hex[:8]}",
            endpoint_url=s3["endpoint_url"],
            env=s3["env"],
        )


@dataclass(frozen=True)
class Trained:
    """A 4-step run on ``store``: committed checkpoints at steps 2 and 4, and the final model."""

    store: Store
    uris: dict[int, str]
    final: torch.nn.Module

    def open(self, step: int) -> ExportSource:
        return self.store.open(self.uris[step])


@pytest.fixture(scope="module")
def trained(store) -> Trained:
    result, uris = store.train_single()
    return Trained(store, uris, result.model)


def stored_model_tensors(src: ExportSource) -> dict[str, TensorStorageMetadata]:
    metadata = src.reader().read_metadata().state_dict_metadata
    return {k: md for k, md in metadata.items() if k.startswith("app.model.")}


def full_model_state(src: ExportSource) -> dict[str, torch.Tensor]:
    """The checkpoint's model tensors in one DCP load of all of them (the reference)."""
    model = {
        k.removeprefix("app.model."): torch.empty(md.size, dtype=md.properties.dtype)
        for k, md in stored_model_tensors(src).items()
    }
    state = {"app": {"model": model}}
    dcp.load(state, storage_reader=src.reader(), no_dist=True)
    return state["app"]["model"]


def fresh_model(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A model with other initial weights, then ``state`` loaded strictly."""
    model = build_model(CFG, seed=1234)
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model.eval()(TOKENS)


def test_export_loads_into_a_fresh_model_with_the_same_logits(trained, tmp_path):
    final = trained.final
    result = export_checkpoint(trained.open(4), tmp_path / "out", preset="gpt-tiny", job_id="j-1")
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert list(state) == list(final.state_dict())  # etrain FQNs, in model order
    assert torch.equal(logits(fresh_model(state)), logits(final))
    assert (result.step, result.num_tensors, result.dtype) == (4, len(state), "float32")
    assert result.num_params == sum(p.numel() for p in final.parameters())

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {
        k: config[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "vocab_size",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "torch_dtype",
        )
    } == {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 256,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    }
    info = json.loads((tmp_path / "out" / "etrain_export.json").read_text())
    assert info["job_id"] == "j-1" and info["step"] == 4 and info["naming"] == "etrain"
    assert info["source_uri"] == trained.uris[4]
    assert info["source_uri"].startswith(f"{trained.store.base}/single/checkpoints/step_00000004")


def test_a_gs_checkpoint_exports_in_place(gcs_server, tmp_path):
    """gs:// (the GCS emulator on loopback) goes through the same reader as s3://."""
    store = Store(
        "gs",
        f"gs://{gcs_server['bucket']}/export-{uuid.uuid4().hex[:8]}",
        endpoint_url=gcs_server["endpoint_url"],
        env={},
    )
    trained, uris = store.train_single()
    final = trained.model
    result = export_checkpoint(store.open(uris[4]), tmp_path / "out", preset="gpt-tiny")
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(logits(fresh_model(state)), logits(final))
    assert result.step == 4 and result.num_tensors == len(final.state_dict())


@pytest.mark.parametrize("batch_bytes", [512 * 1024**2, 1])
def test_an_older_step_matches_a_full_dcp_load(trained, tmp_path, batch_bytes):
    """Step 2 (not the final state), read in one batch or one tensor at a time."""
    export_checkpoint(trained.open(2), tmp_path, preset="gpt-tiny", batch_bytes=batch_bytes)
    reference = full_model_state(trained.open(2))
    exported = load_file(tmp_path / "model.safetensors")
    assert exported.keys() == reference.keys()
    assert all(torch.equal(exported[k], reference[k]) for k in reference)


def spy_reads(monkeypatch) -> list[list]:
    """The read items of every DCP read (FsspecReader, for object stores, is a FileSystemReader)."""
    calls: list[list] = []
    original = FileSystemReader.read_data

    def spy(self, plan, planner):
        calls.append(list(plan.items))
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", spy)
    return calls


def test_only_model_tensors_are_read(trained, tmp_path, monkeypatch):
    calls = spy_reads(monkeypatch)
    export_checkpoint(trained.open(4), tmp_path, preset="gpt-tiny")
    read = [item.storage_index.fqn for items in calls for item in items]
    assert read and all(fqn.startswith("app.model.") for fqn in read)
    stored = trained.open(4).reader().read_metadata().state_dict_metadata
    assert any(k.startswith("app.optim.") for k in stored)  # there was optimizer state to skip


def test_each_read_holds_at_most_one_batch(trained, tmp_path, monkeypatch):
    """The memory bound: every load asks for at most batch_bytes of weights (or one larger
    tensor); on S3 the objects are read in place by ranged GETs, never downloaded first."""
    batch_bytes = 48 * 1024  # embeddings and output (64 KiB) go alone; the rest share
    calls = spy_reads(monkeypatch)
    downloads: list[str] = []
    ranges: list[tuple[int, int]] = []
    if trained.store.kind == "s3":
        import s3fs

        async def no_download(self, rpath, *args, **kwargs):
            downloads.append(rpath)
            raise AssertionError(f"export downloaded {rpath}")

        fetch = s3fs.core.S3File._fetch_range

        def ranged(self, start, end):
            ranges.append((start, end))
            return fetch(self, start, end)

        monkeypatch.setattr(s3fs.S3FileSystem, "_get_file", no_download)
        monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", ranged)
    src = trained.open(4)
    export_checkpoint(src, tmp_path, preset="gpt-tiny", batch_bytes=batch_bytes)
    sizes = [[math.prod(item.lengths) * 4 for item in items] for items in calls]  # fp32
    assert len(sizes) > 2 and not downloads
    assert (len(ranges) >= len(sizes)) == (trained.store.kind == "s3")  # ranged GETs per batch
    assert all(sum(s) <= batch_bytes or len(s) == 1 for s in sizes), sizes
    assert sum(map(sum, sizes)) == sum(
        math.prod(md.size) * 4 for md in stored_model_tensors(src).values()
    )
    exported = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in trained.final.state_dict().items())


def test_bf16_export_is_cast_and_close(trained, tmp_path):
    final = trained.final
    export_checkpoint(trained.open(4), tmp_path, preset="gpt-tiny", dtype="bf16")
    state = load_file(tmp_path / "model.safetensors")
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    restored = fresh_model({k: v.float() for k, v in state.items()})
    assert torch.allclose(logits(restored), logits(final), atol=5e-2)


def test_hf_naming_round_trips_into_our_model(trained, tmp_path):
    final = trained.final
    result = export_checkpoint(trained.open(4), tmp_path, preset="gpt-tiny", naming="hf")
    state = load_file(tmp_path / "model.safetensors")
    assert set(state) == {to_hf_name(k) for k in final.state_dict()}
    assert "model.layers.1.self_attn.q_proj.weight" in state and "lm_head.weight" in state
    assert result.naming == "hf"
    assert torch.equal(logits(fresh_model(from_hf_state_dict(state, CFG))), logits(final))


def _hf_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face Llama's rotary embedding (rotate_half) on ``x`` ``[B, T, H, D]``."""
    d, t = x.shape[-1], x.shape[1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([torch.outer(torch.arange(t).float(), inv)] * 2, dim=-1)
    rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * emb.cos()[None, :, None] + rotated * emb.sin()[None, :, None]


@torch.no_grad()
def test_hf_q_k_layout_gives_the_same_attention_scores_under_hf_rope(trained, tmp_path):
    """Permuted q/k weights under HF's rotate_half RoPE score like ours under interleaved RoPE."""
    final = trained.final
    export_checkpoint(trained.open(4), tmp_path, preset="gpt-tiny", naming="hf")
    hf = load_file(tmp_path / "model.safetensors")
    attn, x = final.layers["0"].attention, torch.randn(1, 10, CFG.dim)
    hd, freqs = CFG.head_dim, final.freqs_cis[:10]
    ours_q = apply_rotary_emb(attn.wq(x).view(1, 10, -1, hd), freqs)
    ours_k = apply_rotary_emb(attn.wk(x).view(1, 10, -1, hd), freqs)
    hf_q = _hf_rope(
        (x @ hf["model.layers.0.self_attn.q_proj.weight"].T).view(1, 10, -1, hd), CFG.rope_theta
    )
    hf_k = _hf_rope(
        (x @ hf["model.layers.0.self_attn.k_proj.weight"].T).view(1, 10, -1, hd), CFG.rope_theta
    )
    rep = CFG.n_heads // CFG.n_kv_heads
    ours = torch.einsum("bqhd,bkhd->bhqk", ours_q, ours_k.repeat_interleave(rep, dim=2))
    theirs = torch.einsum("bqhd,bkhd->bhqk", hf_q, hf_k.repeat_interleave(rep, dim=2))
    assert torch.allclose(ours, theirs, atol=1e-5)


# Folders that look like checkpoints but were never committed, per the store's layout.
UNCOMMITTED = {
    "file": [
        ("step_00000006", "without manifest"),
        ("step_00000008.partial-dead", "with manifest"),
    ],  # rename never ran
    "s3": [("step_00000006.deadbeef", "without manifest"), ("step_00000008", "with manifest")],
}  # object stores never rename


def test_uncommitted_folders_are_refused(trained, tmp_path):
    loc = trained.store.location("uncommitted")
    source = trained.open(4).info.path
    for name, manifest in UNCOMMITTED[trained.store.kind]:
        loc.fs.copy(source, loc.join(name), recursive=True)
        if manifest == "without manifest":
            loc.fs.rm_file(loc.join(name, MANIFEST))
        with pytest.raises(ExportError, match="is not a committed checkpoint"):
            export_checkpoint(
                trained.store.open(loc.uri_of(name)), tmp_path / "out", preset="gpt-tiny"
            )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "gpt-small"}, "does not hold a 'gpt-small' model .*set preset to the job's"),
        ({"preset": "gpt-huge"}, "unknown model preset 'gpt-huge'; set one of: gpt-tiny"),
        (
            {"preset": "gpt-tiny", "dtype": "int8"},
            "dtype 'int8' is not supported; set dtype to one of",
        ),
        ({"preset": "gpt-tiny", "naming": "gguf"}, "naming 'gguf' is not supported; set naming"),
    ],
)
def test_bad_arguments_name_the_fix(trained, tmp_path, kwargs, message):
    with pytest.raises(ExportError, match=message):
        export_checkpoint(trained.open(4), tmp_path, **kwargs)
    assert not (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_open_checkpoint_dir_on_local_disk(tmp_path):
    store = Store("file", f"file://{tmp_path}")
    run(
        store.spec(),
        RunEnv(
            rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(tmp_path / "run")
        ),
    )
    step = tmp_path / "run" / "step_00000004"
    for uri in (f"file://{step}", str(step), f"file://{step}/"):
        src = open_checkpoint_dir(uri)
        assert (src.uri, src.info.step, src.info.path) == (f"file://{step}", 4, str(step))
    with pytest.raises(ExportError, match="must be file:///absolute/path"):
        open_checkpoint_dir("file://host/ckpt")
    with pytest.raises(ExportError, match="does not exist on this machine"):
        open_checkpoint_dir(f"file://{tmp_path}/gone")
    with pytest.raises(
        ExportError, match=re.escape("checkpoint.storage must be file:///abs/path, s3://")
    ):
        open_checkpoint_dir("hdfs://cluster/ckpt/step_00000004")


S3_STEP = "jobs/j-1/checkpoints/step_00000004.0123abcd"


def s3_open_error(s3_server, *, env: dict, uri: str | None = None, **kwargs) -> str:
    uri = uri or f"s3://{s3_server['bucket']}/{S3_STEP}"
    checkpoint = CheckpointSpec(storage=f"s3://{s3_server['bucket']}/jobs")
    stores = StoresSpec(s3={"endpoint_url": s3_server["endpoint_url"], **kwargs})
    with pytest.raises(ExportError) as e:
        open_checkpoint_dir(uri, checkpoint=checkpoint, stores=stores, env=env)
    return str(e.value)


def test_a_missing_s3_step_says_it_is_not_committed(s3_server):
    message = s3_open_error(s3_server, env=s3_server["env"])
    assert f"s3://{s3_server['bucket']}/{S3_STEP} is not a committed checkpoint" in message
    assert "--step N" in message


@pytest.mark.parametrize("wrong", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_refused_s3_credentials_name_their_source_never_their_value(s3_server, wrong):
    env = {**s3_server["env"], wrong: "wrong-" + s3_server["env"][wrong][6:]}
    message = s3_open_error(s3_server, env=env)
    assert "refused the credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in message
    assert "set credentials that may read" in message
    for value in (*env.values(), *s3_server["env"].values()):
        if len(value) > 10:
            assert value not in message


def test_a_missing_named_secret_names_the_variables(s3_server):
    message = s3_open_error(s3_server, env={}, credentials_secret="export-reader")
    assert "ETRAIN_SECRET_EXPORT_READER_ACCESS_KEY_ID" in message and "set " in message


def test_a_checkpoint_sharded_by_two_fsdp_ranks_exports_the_whole_model(store, trained, tmp_path):
    """Two gloo processes (FSDP) save; one process without a process group exports."""
    spec = store.spec(workers=2, cpus_per_worker=1).model_dump(mode="json", by_alias=True)
    spec["parallelism"] = {"strategy": "fsdp"}
    root = "/".join([store.base, "fsdp2", "checkpoints"])
    res = run_local([LocalJob("fsdp2", spec, checkpoint_root=root)], world_size=2)["fsdp2"]
    assert res.error is None, res.error
    step = store.open(store.committed("fsdp2/checkpoints")[4])
    stored = stored_model_tensors(step)
    assert len(stored["app.model.tok_embeddings.weight"].chunks) == 2  # really sharded

    export_checkpoint(step, tmp_path / "out", preset="gpt-tiny", batch_bytes=48 * 1024)
    exported = load_file(tmp_path / "out" / "model.safetensors")
    reference = full_model_state(step)
    assert all(torch.equal(exported[k], reference[k]) for k in reference)
    # The same spec on one process trains to the same weights (up to reduction order).
    assert torch.allclose(logits(fresh_model(exported)), logits(trained.final), atol=1e-5, rtol=0)
