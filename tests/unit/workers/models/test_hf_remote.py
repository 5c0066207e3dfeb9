"""model.hf read by byte range (workers.models.hf_remote): the same blocks as safe_open.

The reader works on any fsspec store; a ``file://`` location stands in for S3 and GCS
here (no server in unit tests; tests/integration/test_hf_object_store.py uses moto).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.hf_fixtures import make_hf_model
from workers.models.hf_load import (
    LocalWeights,
    _read_block,
    hf_model_config,
    load_pretrained,
    materialize,
)
from workers.models.hf_naming import to_hf_name
from workers.models.hf_remote import RemoteWeights, is_remote, model_location, read_small
from workers.models.llama import build_model
from workers.storage.location import resolve_storage


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    make_hf_model(folder, "qwen2", max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


def _remote(folder) -> RemoteWeights:
    return RemoteWeights(resolve_storage(f"file://{folder}"))


@pytest.mark.parametrize(
    ("fqn", "start", "rows", "col"),
    [
        ("layers.1.attention.wq.weight", 20, 7, None),  # RoPE-permuted, cuts heads
        ("layers.1.attention.wk.bias", 3, 5, None),
        ("layers.0.feed_forward.w1.weight", 4, 9, None),
        ("layers.0.feed_forward.w2.weight", 0, 32, (8, 16)),  # a column block (TP)
        ("tok_embeddings.weight", 100, 50, None),
    ],
)
def test_a_ranged_block_equals_the_safe_open_block(qwen, fqn, start, rows, col):
    cfg = hf_model_config(str(qwen))
    local, remote = LocalWeights(str(qwen)), _remote(qwen)
    name = to_hf_name(fqn)
    stored = local.shape(name)
    assert remote.shape(name) == stored
    cols = (col[1],) if col else tuple(stored[1:])
    shape, offset = (rows, *cols), (start, *((col[0],) if col else (0,) * (len(stored) - 1)))
    want = _read_block(local, name, fqn, shape, offset, cfg)
    got = _read_block(remote, name, fqn, shape, offset, cfg)
    assert got.shape == want.shape and torch.equal(got, want)


def test_a_rank_fetches_only_its_rows(qwen):
    remote = _remote(qwen)
    name = "model.embed_tokens.weight"
    vocab, dim = remote.shape(name)
    headers = remote.bytes_fetched
    remote.read(name, (slice(0, vocab // 2), slice(0, dim)))
    assert remote.bytes_fetched - headers == vocab // 2 * dim * 4


def test_a_whole_model_from_the_store_equals_the_local_load(qwen):
    cfg = hf_model_config(str(qwen))
    models = []
    for weights in (LocalWeights(str(qwen)), _remote(qwen)):
        model = build_model(cfg, seed=0, device="meta")
        materialize(model, device="cpu")
        assert load_pretrained([model], str(qwen), cfg, weights=weights) > 0
        models.append(model)
    for (n, a), (_, b) in zip(*(m.state_dict().items() for m in models), strict=True):
        assert torch.equal(a, b), n


def test_missing_files_name_model_hf(tmp_path):
    loc = resolve_storage(f"file://{tmp_path}")
    with pytest.raises(ValueError, match=r"model\.hf .* has no config\.json"):
        read_small(loc, "config.json", 1 << 20)
    with pytest.raises(ValueError, match=r"model\.hf.*neither model\.safetensors"):
        RemoteWeights(loc)
    (tmp_path / "config.json").write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        read_small(loc, "config.json", 10)


def test_object_store_uris_resolve_through_stores(monkeypatch):
    from workers.spec import StoresSpec
    from workers.storage.location import stores_for

    assert is_remote("s3://b/m") and is_remote("gs://b/m") and not is_remote("/data/m")
    stores = stores_for(
        StoresSpec.model_validate({"s3": {"endpoint_url": "https://minio.example:9000"}})
    )

    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "half-a-key-pair")
    with pytest.raises(ValueError, match=r"model\.hf s3://b/m: .*AWS_SECRET_ACCESS_KEY"):
        model_location("s3://b/m", stores)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    loc = model_location("s3://b/m", stores)
    assert (loc.root, loc.endpoint_url) == ("b/m", "https://minio.example:9000")
    plain = model_location("s3://b/m/")  # no stores: fsspec's defaults
    assert (plain.root, plain.join("config.json")) == ("b/m", "b/m/config.json")


def test_a_lora_base_in_a_store_is_fingerprinted_through_stores(qwen):
    from workers.models.lora import hf_fingerprint

    seen = []

    def stores(uri):  # the store as the spec reaches it; here the local copy stands in
        seen.append(uri)
        return resolve_storage(f"file://{qwen}")

    assert hf_fingerprint("s3://models/qwen2", stores) == hf_fingerprint(str(qwen))
    assert seen == ["s3://models/qwen2"]


def test_a_store_error_while_reading_names_model_hf(qwen, monkeypatch):
    remote = _remote(qwen)
    name = "model.embed_tokens.weight"
    remote.shape(name)  # the header is read

    def refuse(*args, **kwargs):
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(remote.loc.fs, "cat_file", refuse)
    with pytest.raises(ValueError, match=r"^model\.hf file://.*AccessDenied"):
        remote.read(name, (slice(0, 2), slice(0, 4)))


@pytest.mark.parametrize("name", ["../other/model.safetensors", "/abs/model.safetensors", ""])
def test_an_index_in_a_store_names_only_files_in_its_folder(tmp_path, name):
    """The store's index is read by the same rule as a local one: a weight map entry that
    leaves the folder (another prefix of the bucket) is refused before anything is fetched."""
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": name}})
    )
    with pytest.raises(PermissionError, match="weight_map"):
        _remote(tmp_path)


def test_an_index_naming_too_many_files_is_refused(tmp_path):
    from workers.models.hf_index import MAX_SHARDS

    shards = {f"t{i}": f"s{i}.safetensors" for i in range(MAX_SHARDS + 1)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    with pytest.raises(ValueError, match=f"over {MAX_SHARDS}"):
        _remote(tmp_path)
