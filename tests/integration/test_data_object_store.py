"""Datasets and tokenizers on an object store (moto S3 on loopback): jsonl and parquet
read from s3:// prepare the same shards as the local file, a tokenizer folder on s3://
is fetched once into the node cache, a prepared folder on s3:// is copied and
memory-mapped, a job trains from s3:// data with the same losses as from the local
file, and a missing object or a bad row is an error naming the URL and the row."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.hf_fixtures import make_word_tokenizer
from tests.support.local_launch import LocalJob, run_local
from tests.support.s3_fixture import s3_client
from workers.data import TokenDataset, dataset_for
from workers.data.prepare import local_prepared, prepare
from workers.data.samples import ShapeOptions
from workers.data.tokenizer import local_tokenizer, tokenizer_hash
from workers.spec import JobSpec
from workers.spec.data import DataSpec
from workers.spec.stores import StoresSpec
from workers.storage.location import resolve_store

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

WORDS = "the quick brown fox jumps over lazy dog hello world answer four".split()  # noqa: SIM905
ROWS = [
    {"prompt": " ".join(WORDS[i % 5 : i % 5 + 3]), "completion": " ".join(WORDS[i % 7 :][:4])}
    for i in range(24)
]
OPTS = ShapeOptions(shape="instruction", seq_len=16)


@pytest.fixture(scope="module")
def s3(s3_server, tmp_path_factory):
    """The bucket filled with rows.jsonl, rows.parquet, a bad jsonl, a tokenizer folder and a
    prepared folder; the store options (checkpoint section); the local files; AWS env set."""
    root = tmp_path_factory.mktemp("objdata")
    make_word_tokenizer(root / "tok", corpus=[" ".join(WORDS)])
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), root / "rows.parquet", row_group_size=5)
    bad = [*ROWS[:3], {"prompt": "no completion"}]
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    prepare(
        source="jsonl",
        path=str(root / "rows.jsonl"),
        tokenizer=str(root / "tok"),
        opts=OPTS,
        out=str(root / "prepared"),
        vocab_size=256,
    )
    env = s3_server["env"]
    client = s3_client(s3_server)
    bucket = s3_server["bucket"]
    for local, key in [
        *[(root / n, f"data/{n}") for n in ("rows.jsonl", "rows.parquet", "bad.jsonl")],
        *[(p, f"data/tok/{p.name}") for p in (root / "tok").iterdir() if p.is_file()],
        *[(p, f"data/prepared/{p.name}") for p in (root / "prepared").iterdir()],
    ]:
        client.upload_file(str(local), bucket, key)
    sections = {
        "checkpoint": {"storage": f"s3://{bucket}/ck"},
        "stores": {
            "s3": {"endpoint_url": s3_server["endpoint_url"], "region": s3_server["region"]}
        },
    }
    stores = StoresSpec.model_validate(sections["stores"])
    saved = {k: os.environ.get(k) for k in (*env, "ETRAIN_DATA_CACHE")}
    os.environ.update({**env, "ETRAIN_DATA_CACHE": str(root / "cache")})
    yield {
        "url": f"s3://{bucket}/data",
        "stores": lambda uri: resolve_store(uri, stores),
        "sections": sections,  # the spec's checkpoint and stores
        "root": root,
    }
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _shards(folder) -> tuple[np.ndarray, np.ndarray]:
    ds = TokenDataset(str(folder))
    tokens = np.stack([ds[i][0].numpy() for i in range(len(ds))])
    labels = np.stack([ds[i][1].numpy() for i in range(len(ds))])
    return tokens, labels


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_object_store_rows_prepare_the_same_shards_as_the_local_file(s3, source):
    out = s3["root"] / f"from-s3-{source}"
    index = prepare(
        source=source,
        path=f"{s3['url']}/rows.{source}",
        tokenizer=f"{s3['url']}/tok",
        opts=OPTS,
        out=str(out),
        vocab_size=256,
        stores=s3["stores"],
    )
    assert index["num_samples"] == len(ROWS)
    assert index["source"]["url"] == f"{s3['url']}/rows.{source}" and index["source"]["etag"]
    assert index["tokenizer"]["sha256"] == tokenizer_hash(str(s3["root"] / "tok"))
    got, want = _shards(out), _shards(s3["root"] / "prepared")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert (got[1] != -100).any()


def test_tokenizer_and_prepared_folder_are_fetched_once_per_node(s3):
    tok = local_tokenizer(f"{s3['url']}/tok", s3["stores"])
    assert tokenizer_hash(tok) == tokenizer_hash(str(s3["root"] / "tok"))
    assert local_tokenizer(f"{s3['url']}/tok/", s3["stores"]) == tok  # cached
    folder = local_prepared(f"{s3['url']}/prepared", s3["stores"])
    assert folder.startswith(str(s3["root"] / "cache"))
    assert local_prepared(f"{s3['url']}/prepared", s3["stores"]) == folder
    got, want = _shards(folder), _shards(s3["root"] / "prepared")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize(
    ("path", "source", "words"),
    [
        ("missing.jsonl", "jsonl", "missing.jsonl' does not exist"),
        ("bad.jsonl", "jsonl", "bad.jsonl' row 4: no field 'completion'"),
        ("rows.jsonl", "parquet", "rows.jsonl': not a readable parquet file"),
        ("nothing-here", "prepared", "nothing-here' is not a prepared folder"),
    ],
)
def test_bad_object_store_data_names_the_url_and_row(s3, path, source, words):
    data = DataSpec(source=source, path=f"{s3['url']}/{path}", shape="instruction", seq_len=16)
    with pytest.raises(ValueError) as info:
        dataset_for(data, tokenizer=f"{s3['url']}/tok", vocab_size=256, seed=0, stores=s3["stores"])
    msg = str(info.value)
    assert f"data.path '{s3['url']}/{words}" in msg or f"{s3['url']}/{words}" in msg, msg
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in msg


def test_tokenizer_folder_without_tokenizer_json_is_refused(s3):
    with pytest.raises(ValueError, match=r"model.tokenizer 's3://.*/data/prepared' has no "):
        local_tokenizer(f"{s3['url']}/prepared", s3["stores"])


def _job(name: str, data: dict, tokenizer: str, sections: dict | None) -> dict:
    raw = {
        "name": name,
        "model": {"preset": "gpt-tiny", "tokenizer": tokenizer},
        "data": {"seq_len": 16, "shape": "instruction", **data},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "parallelism": {"strategy": "ddp"},
        "train": {
            "steps": 4,
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "lr": 0.05,
            "warmup_steps": 1,
            "optimizer": "sgd",
        },
        **(sections or {}),
    }
    return JobSpec.model_validate(raw).model_dump(mode="json", by_alias=True)


def test_a_job_trains_from_object_store_data_like_from_the_local_file(s3):
    local = {"source": "jsonl", "path": str(s3["root"] / "rows.jsonl")}
    remote = {"source": "parquet", "path": f"{s3['url']}/rows.parquet"}
    out = run_local(
        [
            LocalJob("local", _job("local", local, str(s3["root"] / "tok"), None)),
            LocalJob("s3", _job("s3", remote, f"{s3['url']}/tok", s3["sections"])),
        ],
        world_size=2,
    )
    assert out["local"].error is None, out["local"].error
    assert out["s3"].error is None, out["s3"].error
    assert set(out["s3"].losses) == {1, 2, 3, 4}
    for step, loss in out["local"].losses.items():
        assert out["s3"].losses[step] == pytest.approx(loss, rel=1e-6), step


def test_etrain_data_prepare_reads_object_store_inputs_with_the_specs_store(s3):
    import yaml
    from typer.testing import CliRunner

    from service import cli

    spec = s3["root"] / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "model": {"tokenizer": f"{s3['url']}/tok"},
                "data": {"source": "jsonl", "path": f"{s3['url']}/rows.jsonl", "seq_len": 16},
                **s3["sections"],
            }
        )
    )
    out = s3["root"] / "cli-prepared"
    args = ["data", "prepare", "--spec", str(spec), "--out", str(out), "--shape", "instruction"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert "prepared 24 instruction samples of 17 tokens from rows.jsonl" in result.output
    got, want = _shards(out), _shards(s3["root"] / "prepared")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def _submit_spec(s3, source: str, path: str, *, sections=None, **data) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "check",
            "model": {"preset": "gpt-tiny", "tokenizer": f"{s3['url']}/tok"},
            "data": {"source": source, "path": path, "seq_len": 16, **data},
            **(sections or s3["sections"]),
        }
    )


@pytest.mark.parametrize(
    ("source", "name", "data", "words"),
    [
        ("jsonl", "rows.jsonl", {"shape": "instruction"}, None),
        ("parquet", "rows.parquet", {"shape": "instruction"}, None),
        ("prepared", "prepared", {}, None),
        ("jsonl", "missing.jsonl", {}, "missing.jsonl' does not exist"),
        ("jsonl", "bad.jsonl", {"shape": "instruction"}, "bad.jsonl' row 4: no field"),
        ("parquet", "rows.parquet", {"shape": "chat"}, "no column 'messages'"),
        ("parquet", "rows.jsonl", {}, "rows.jsonl': not a readable parquet file"),
        ("prepared", "prepared", {"seq_len": 32}, "set data.seq_len: 16"),
        ("prepared", "nothing", {}, "nothing' does not exist (index.json not found)"),
    ],
)
def test_submit_check_reads_the_head_of_object_store_data(s3, source, name, data, words):
    from service.domain.data_check import data_refusals
    from service.domain.storage_check import StorageProbes

    spec = _submit_spec(s3, source, f"{s3['url']}/{name}", **data)
    probes = StorageProbes(workers=2, per_tenant=1, timeout_s=10)
    got = data_refusals(spec, probes=probes, tenant="t")
    if words is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0][0] == ("data", "path"), got
        assert f"{s3['url']}/" in got[0][1] and words in got[0][1], got[0][1]
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in got[0][1]


def test_submit_check_of_an_unreachable_store_is_a_bounded_refusal(s3):
    from service.domain.data_check import data_refusals
    from service.domain.storage_check import StorageProbes

    sections = {
        "checkpoint": {"storage": "s3://bkt/ck"},
        "stores": {"s3": {"endpoint_url": "http://127.0.0.1:1"}},
    }
    spec = _submit_spec(s3, "jsonl", "s3://bkt/rows.jsonl", sections=sections)
    got = data_refusals(
        spec, probes=StorageProbes(workers=1, per_tenant=1, timeout_s=2), tenant="t"
    )
    assert len(got) == 1 and got[0][0] == ("data", "path")
    assert "s3://bkt/rows.jsonl" in got[0][1]
    assert "cannot read it" in got[0][1] or "did not answer within 2 s" in got[0][1]


def test_each_store_streams_rows_and_gives_the_tokenizer(object_store, s3, tmp_path):
    """S3 and GCS alike: parquet rows and a tokenizer folder under a prefix of the store,
    reached through the spec's stores section, prepare the local file's shards."""
    stores = object_store.stores_spec()
    loc = object_store.location("objdata")
    local = s3["root"]
    loc.fs.put_file(str(local / "rows.parquet"), loc.join("rows.parquet"))
    for p in (local / "tok").iterdir():
        loc.fs.put_file(str(p), loc.join("tok", p.name))
    index = prepare(
        source="parquet",
        path=object_store.uri("objdata", "rows.parquet"),
        tokenizer=object_store.uri("objdata", "tok"),
        opts=OPTS,
        out=str(tmp_path / "out"),
        vocab_size=256,
        stores=lambda uri: resolve_store(uri, stores, env=object_store.env),
    )
    assert index["source"]["url"] == object_store.uri("objdata", "rows.parquet")
    got, want = _shards(tmp_path / "out"), _shards(local / "prepared")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_changed_object_is_tokenized_again_under_a_new_cache_key(s3):
    """The per-node cache of a raw object is keyed by its URL, size and ETag: the same
    bytes written again reuse the shards, other bytes are tokenized again."""
    stores = s3["stores"]
    fs, root = stores(f"{s3['url']}/changing.jsonl").fs, f"{s3['url']}/changing.jsonl"
    data = DataSpec(source="jsonl", path=root, shape="instruction", seq_len=16)

    def dataset(rows):
        with fs.open(root.removeprefix("s3://"), "wb") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
        return dataset_for(
            data, tokenizer=f"{s3['url']}/tok", vocab_size=256, seed=0, stores=stores
        )

    first, again = dataset(ROWS[:10]), dataset(ROWS[:10])
    changed = dataset(ROWS[:7])
    assert len(first) == len(again) == 10 and len(changed) == 7
    assert first.index["source"] == again.index["source"]  # the cached shards
    assert changed.index["source"]["etag"] != first.index["source"]["etag"]
