"""The workers' own loaders against a hostile tenant's files: the check at the moment of use.

Tenant A's job runs with A's roots in its environment (``ETRAIN_STORAGE_ROOTS``, as the
service writes them). A prepares each trick in its own area; the real loaders (weights
and their index, config.json, tokenizer files, prepared shards, data files, the
checkpoint folder, the node cache) must refuse it, must not block, and must not hand
back a byte of tenant B's files. One case per trick; each passes on a loader that reads
what it is handed only when it is confined. The data loaders run once per spec section
that names a data file (``data`` and the evaluation source ``data.eval``), and their
refusal names that section's path field.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.support.hf_fixtures import make_hf_model, make_word_tokenizer
from workers.spec.data import DataSpec, EvalDataSpec
from workers.storage.confine import ROOTS_ENV, ConfinementError, Roots

B_SECRET = "tenant-b-secret-text"
# The spec sections that name a data file, each read by the same loaders.
SECTIONS = {"data": DataSpec, "data.eval": EvalDataSpec}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tenant A's and B's data areas and checkpoint areas, each with a model, a tokenizer,
    a jsonl file and a prepared folder; B's hold B_SECRET where text can."""
    from workers.data.prepare import prepare
    from workers.data.samples import ShapeOptions

    root = tmp_path_factory.mktemp("confine")
    out = {}
    for t in ("a", "b"):
        area = root / "tenants" / t
        make_hf_model(area / "m", "llama", max_shard_size="20KB", seed=1 if t == "a" else 2)
        make_word_tokenizer(area / "tok")
        rows = [{"text": f"{B_SECRET if t == 'b' else 'hello'} world {i}"} for i in range(40)]
        (area / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        prepare(
            source="jsonl",
            path=str(area / "rows.jsonl"),
            tokenizer=str(area / "tok"),
            opts=ShapeOptions(shape="text", seq_len=8),
            out=str(area / "prepared"),
            vocab_size=None,
        )
        (root / "checkpoints" / t).mkdir(parents=True)
        out[t] = area
    out["root"] = root
    return out


@pytest.fixture
def a(world, tmp_path, monkeypatch):
    """A fresh copy of tenant A's area per case (cases plant links in it), A's roots in the
    environment as the service writes them; returns A's area."""
    area = tmp_path / "tenants" / "a"
    shutil.copytree(world["a"], area, symlinks=True)
    ck = tmp_path / "checkpoints" / "a"
    ck.mkdir(parents=True)
    roots = Roots.of([area], [ck])
    monkeypatch.setenv(ROOTS_ENV, roots.env()[ROOTS_ENV])
    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path / "cache"))
    return area


def _link(path: Path, target) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _index(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def _write_index(folder: Path, weight_map: dict) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


# -- each case: plant the trick in A's area, then run the loader A's job runs ---------------


def weights_absolute(a, b):
    m = _index(a / "m")["weight_map"]
    _write_index(a / "m", {k: str(b / "m" / v) for k, v in m.items()})
    return lambda: _load_weights(a)


def weights_dotdot(a, b):
    m = _index(a / "m")["weight_map"]
    _write_index(a / "m", {k: f"../../b/m/{v}" for k, v in m.items()})
    return lambda: _load_weights(a)


def weights_shard_link(a, b):
    shard = sorted(set(_index(a / "m")["weight_map"].values()))[0]
    _link(a / "m" / shard, b / "m" / shard)
    return lambda: _load_weights(a)


def weights_folder_link(a, b):
    _link(a / "m", b / "m")  # the named folder itself, swapped after submit
    return lambda: _load_weights(a)


def config_link(a, b):
    _link(a / "m" / "config.json", b / "m" / "config.json")
    from workers.models.hf_load import hf_model_config

    return lambda: hf_model_config(str(a / "m"))


def tokenizer_config_fifo(a, b):
    _fifo(a / "tok" / "tokenizer_config.json")
    from workers.data.tokenizer import load_tokenizer, local_tokenizer

    return lambda: load_tokenizer(local_tokenizer(str(a / "tok")))


def lora_fingerprint_link(a, b):
    _link(a / "m" / "config.json", b / "m" / "config.json")
    from workers.models.lora import hf_fingerprint

    return lambda: hf_fingerprint(str(a / "m"))


def tokenizer_link(a, b):
    _link(a / "tok" / "tokenizer.json", b / "tok" / "tokenizer.json")
    from workers.data.tokenizer import local_tokenizer

    return lambda: local_tokenizer(str(a / "tok"))


# -- data files: each case takes the section class (DataSpec or EvalDataSpec) too ----------


def prepared_tokens_link(a, b, spec):
    _link(a / "prepared" / "tokens.npy", b / "prepared" / "tokens.npy")
    return lambda: _prepared(a, spec)


def prepared_index_link(a, b, spec):
    _link(a / "prepared" / "index.json", b / "prepared" / "index.json")
    return lambda: _prepared(a, spec)


def prepared_index_fifo(a, b, spec):
    _fifo(a / "prepared" / "index.json")
    return lambda: _prepared(a, spec)


def prepared_index_huge(a, b, spec):
    with open(a / "prepared" / "index.json", "r+b") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB on no disk, read whole before the fix
    return lambda: _prepared(a, spec)


def prepared_tokens_fifo(a, b, spec):
    _fifo(a / "prepared" / "tokens.npy")
    return lambda: _prepared(a, spec)


def prepared_tokens_device(a, b, spec):
    _link(a / "prepared" / "tokens.npy", "/dev/zero")
    return lambda: _prepared(a, spec)


def jsonl_swapped_for_link(a, b, spec):
    _link(a / "rows.jsonl", b / "rows.jsonl")  # after submit: the service saw a file
    return lambda: _byte_data(a, "jsonl", spec)


def text_relative_link_out(a, b, spec):
    _link(a / "rows.jsonl", os.path.relpath(b / "rows.jsonl", a))
    return lambda: _byte_data(a, "text", spec)


def text_fifo(a, b, spec):
    _fifo(a / "rows.jsonl")
    return lambda: _byte_data(a, "text", spec)


def tokenized_jsonl_link(a, b, spec):
    _link(a / "rows.jsonl", b / "rows.jsonl")
    return lambda: _tokenized(a, "rows.jsonl", spec)


def tokenized_jsonl_fifo(a, b, spec):
    _fifo(a / "rows.jsonl")
    return lambda: _tokenized(a, "rows.jsonl", spec)


def tokenized_jsonl_folder(a, b, spec):
    (a / "rows.jsonl").unlink()
    (a / "rows.jsonl").mkdir()  # a folder where the file was
    return lambda: _tokenized(a, "rows.jsonl", spec)


def _load_weights(a):
    from workers.models.hf_load import LocalWeights

    w = LocalWeights(str(a / "m"))
    return [w.read(n, (slice(0, 1),)) for n in w.names()]


def _prepared(a, spec=DataSpec):
    from workers.data import dataset_for

    data = spec(source="prepared", path=str(a / "prepared"), seq_len=8)
    ds = dataset_for(data, tokenizer=None, vocab_size=256, seed=0)
    return [ds[i] for i in range(len(ds))]


def _byte_data(a, source, spec=DataSpec):
    """The file read as bytes (no tokenizer), as a section of ``spec``'s class names it."""
    from workers.data import dataset_for

    data = spec(source=source, path=str(a / "rows.jsonl"), seq_len=8)
    ds = dataset_for(data, tokenizer=None, vocab_size=256, seed=0)
    return [ds[i] for i in range(len(ds))]


def _tokenized(a, name, spec=DataSpec):
    from workers.data import dataset_for

    data = spec(source="jsonl", path=str(a / name), shape="text", seq_len=8)
    return dataset_for(data, tokenizer=str(a / "tok"), vocab_size=256, seed=0)


CASES = [
    weights_absolute,
    weights_dotdot,
    weights_shard_link,
    weights_folder_link,
    config_link,
    tokenizer_config_fifo,
    lora_fingerprint_link,
    tokenizer_link,
]
DATA_CASES = [
    prepared_tokens_link,
    prepared_index_link,
    prepared_index_fifo,
    prepared_index_huge,
    prepared_tokens_fifo,
    prepared_tokens_device,
    jsonl_swapped_for_link,
    text_relative_link_out,
    text_fifo,
    tokenized_jsonl_link,
    tokenized_jsonl_fifo,
    tokenized_jsonl_folder,
]


def _refused_quickly(load) -> str:
    """The message of ``load()``'s refusal, which must come fast and hold none of B's bytes."""
    started = time.monotonic()
    with pytest.raises((ConfinementError, ValueError)) as e:
        load()
    assert time.monotonic() - started < 20  # a pipe or a 3 GiB file: refused, not read
    assert B_SECRET not in str(e.value)  # names its own file, never what is at a link's end
    return str(e.value)


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_loader_refuses_the_trick_quickly_and_reveals_nothing(world, a, case):
    _refused_quickly(case(a, world["b"]))


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("case", DATA_CASES, ids=[c.__name__ for c in DATA_CASES])
def test_a_data_loader_refuses_the_trick_naming_the_field(world, a, case, section):
    """The same refusal for a training and an evaluation source; the message names the
    field of the section that named the file, not the other one."""
    msg = _refused_quickly(case(a, world["b"], SECTIONS[section]))
    other = "data.path" if section == "data.eval" else "data.eval.path"
    assert f"{section}.path" in msg and other not in msg, msg


def test_the_same_loaders_read_the_tenants_own_files(world, a):
    """The control: every loader above reads A's untouched area."""
    from workers.data.tokenizer import local_tokenizer
    from workers.models.hf_load import hf_model_config
    from workers.models.lora import hf_fingerprint

    assert len(_load_weights(a)) > 4
    assert hf_model_config(str(a / "m")).n_layers >= 1
    assert hf_fingerprint(str(a / "m"))["weights"]
    assert os.path.isfile(os.path.join(local_tokenizer(str(a / "tok")), "tokenizer.json"))


@pytest.mark.parametrize("section", SECTIONS)
def test_the_data_loaders_read_the_tenants_own_files(world, a, section):
    """The control of the data cases, for either section: A's untouched files are read,
    links inside A's area included."""
    spec = SECTIONS[section]
    _link(a / "inner.jsonl", "rows.jsonl")  # a link that stays inside is followed
    assert len(_prepared(a, spec)) > 0
    assert len(_byte_data(a, "jsonl", spec)) > 0
    assert len(_byte_data(a, "text", spec)) > 0
    assert len(_tokenized(a, "inner.jsonl", spec)) > 0


def test_a_checkpoint_folder_swapped_for_a_link_to_another_job_is_refused(world, a, tmp_path):
    """The job's checkpoint folder replaced by a link to tenant B's job: no restore from it,
    no save or prune in it; B's folder is unchanged, bytes and mtimes."""
    from workers.checkpoint.manager import CheckpointManager

    theirs = world["root"] / "checkpoints" / "b" / "job"
    (theirs / "step_00000004").mkdir(parents=True, exist_ok=True)
    (theirs / "step_00000004" / "manifest.json").write_text('{"step": 4}')
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in theirs.rglob("*") if p.is_file()}
    mine = tmp_path / "checkpoints" / "a" / "job"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.symlink_to(theirs)
    manager = CheckpointManager(str(mine), keep_last=1, rank=0)
    with pytest.raises(ConfinementError):
        manager.latest()
    with pytest.raises(ConfinementError):
        manager.begin(8)
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in theirs.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in theirs.iterdir()) == ["step_00000004"]
    # and outside the write roots altogether (a data folder of A's own): refused too
    with pytest.raises(ConfinementError):
        CheckpointManager(str(a / "ck"), keep_last=1, rank=0).begin(1)


def test_node_cache_entries_are_the_tenants_own_and_keyed_by_the_store(tmp_path, monkeypatch):
    """Two tenants' jobs on one node: the same index.json in two tenants' folders (or two
    endpoints' buckets of one name) never share a cache folder."""
    from workers.data import remote

    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path))
    seen = set()
    for tenant in ("a", "b"):
        roots = Roots.of([tmp_path / "tenants" / tenant], [tmp_path / "ck" / tenant])
        monkeypatch.setenv(ROOTS_ENV, roots.env()[ROOTS_ENV])
        seen.add(remote.cache_root())
    assert len(seen) == 2 and all(Path(p).parent == tmp_path for p in seen)

    class Loc:
        def __init__(self, endpoint):
            self.endpoint_url = endpoint

    one = remote.store_identity("s3://data/x", lambda url: Loc("http://127.0.0.1:9000"))
    two = remote.store_identity("s3://data/x", lambda url: Loc("http://127.0.0.1:9001"))
    assert one != two and one["url"] == "s3://data/x"


def test_the_loaders_are_unconfined_only_without_roots(world, tmp_path, monkeypatch):
    """A process the service did not start (the CLI on a user's own files) reads links out,
    still never a pipe; with roots set, the same link is refused."""
    from workers.data.prepare import read_index

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "index.json").symlink_to(world["a"] / "prepared" / "index.json")
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    assert read_index(str(folder))["seq_len"] == 8
    os.mkfifo(folder / "fifo")
    with pytest.raises(ConfinementError, match="named pipe"):
        from workers.storage.confine import UNCONFINED, read_bounded

        read_bounded(str(folder / "fifo"), UNCONFINED, 100)
    monkeypatch.setenv(ROOTS_ENV, Roots.of([folder]).env()[ROOTS_ENV])
    with pytest.raises(ValueError, match="outside"):
        read_index(str(folder))
