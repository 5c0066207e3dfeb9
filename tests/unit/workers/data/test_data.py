"""Unit tests for ``workers.data``: datasets, the global sampler, sharding and collation."""

import itertools
import json
import re
from collections import Counter

import pytest
import torch

from workers.data import (
    GlobalBatchSampler,
    SamplerState,
    build_dataset,
    collate,
    shard_global_batch,
)


def synthetic(**overrides):
    args = dict(source="synthetic", path=None, seq_len=32, num_samples=50, vocab_size=256, seed=0)
    return build_dataset(**{**args, **overrides})


# ---- datasets -----------------------------------------------------------------


def test_synthetic_is_deterministic_per_index():
    a, b = synthetic(), synthetic()
    forward = [a[i] for i in range(len(a))]
    backward = [b[i] for i in reversed(range(len(b)))][::-1]
    for x, y in zip(forward, backward, strict=True):
        assert torch.equal(x, y)
    assert len(a) == 50 and a[0].shape == (33,) and a[0].dtype == torch.long
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], synthetic(seed=1)[0])


def test_synthetic_is_learnable():
    ds = synthetic(seq_len=512, num_samples=8, vocab_size=64)
    pairs = Counter()
    for i in range(len(ds)):
        s = ds[i].tolist()
        assert min(s) >= 0 and max(s) < 64
        pairs.update(itertools.pairwise(s))
    # Most transitions follow one of each token's few favoured successors.
    by_prev = {}
    for (prev, _nxt), n in pairs.items():
        by_prev.setdefault(prev, []).append(n)
    covered = sum(sum(sorted(v, reverse=True)[:4]) for v in by_prev.values())
    assert covered / sum(pairs.values()) > 0.8


def test_text_windows(tmp_path):
    path = tmp_path / "corpus.txt"
    data = "héllo wörld, byte-level!".encode()
    path.write_bytes(data)
    ds = build_dataset(
        source="text", path=str(path), seq_len=4, num_samples=1, vocab_size=256, seed=0
    )
    assert len(ds) == len(data) // 5
    for i in range(len(ds)):
        assert ds[i].tolist() == list(data[i * 5 : (i + 1) * 5])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_jsonl_concatenates_texts(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "ab"}\n\n{"text": "cd", "id": 2}\n')
    ds = build_dataset(
        source="jsonl", path=str(path), seq_len=2, num_samples=1, vocab_size=256, seed=0
    )
    assert len(ds) == 1
    assert bytes(ds[0].tolist()) == b"ab\n"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "ok"}\nnot json\n', "line 2"),
        ('{"text": "ok"}\n{"body": "x"}\n', "line 2.*'text'"),
        ('["text"]\n', "line 1"),
        (b'{"text": "\xff"}\n', "line 1"),
    ],
)
def test_jsonl_bad_lines_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        build_dataset(
            source="jsonl", path=str(path), seq_len=2, num_samples=1, vocab_size=256, seed=0
        )


@pytest.mark.parametrize("source", ["text", "jsonl"])
def test_file_errors_name_data_path(tmp_path, source):
    kwargs = dict(source=source, seq_len=32, num_samples=1, vocab_size=256, seed=0)
    with pytest.raises(ValueError, match=r"data\.path .* does not exist"):
        build_dataset(path=str(tmp_path / "missing"), **kwargs)
    with pytest.raises(ValueError, match=re.escape("data.path is required")):
        build_dataset(path=None, **kwargs)
    for name, content in (("empty", b""), ("short", b'{"text": "abc"}\n')):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=r"data\.path .* fewer than one sample"):
            build_dataset(path=str(tmp_path / name), **kwargs)
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        build_dataset(path=str(tmp_path / "short"), **{**kwargs, "vocab_size": 128})


def test_unknown_source():
    with pytest.raises(ValueError, match=re.escape("data.source")):
        build_dataset(source="parquet", path=None, seq_len=8, num_samples=1, vocab_size=256, seed=0)


# ---- sampler ------------------------------------------------------------------


def drain(sampler, batch_sizes):
    return [pair for bs in batch_sizes for pair in sampler.next_global_batch(bs)]


@pytest.mark.parametrize("num_samples", [1, 7, 20])
@pytest.mark.parametrize("batch_size", [1, 3, 8, 20, 45])
def test_every_sample_of_every_epoch_exactly_once(num_samples, batch_size):
    sampler = GlobalBatchSampler(num_samples, seed=11)
    epochs = 4
    steps = -(-epochs * num_samples // batch_size)  # ceil: cover at least `epochs` epochs
    batches = [sampler.next_global_batch(batch_size) for _ in range(steps)]
    assert all(len(b) == batch_size for b in batches)
    seen = Counter(pair for b in batches for pair in b)
    assert max(seen.values()) == 1
    for epoch in range(steps * batch_size // num_samples):
        assert {i for e, i in seen if e == epoch} == set(range(num_samples))


def test_epochs_differ_and_seed_matters():
    a = GlobalBatchSampler(50, seed=0)
    first, second = a.next_global_batch(50), a.next_global_batch(50)
    assert [i for _, i in first] != [i for _, i in second]
    other = GlobalBatchSampler(50, seed=1).next_global_batch(50)
    assert [i for _, i in first] != [i for _, i in other]


@pytest.mark.parametrize("stop_after", [0, 1, 3, 5])
def test_resume_matches_uninterrupted(stop_after):
    sizes = [6, 4, 9, 6, 7, 5, 8, 3]
    reference = drain(GlobalBatchSampler(13, seed=5), sizes)
    first = GlobalBatchSampler(13, seed=5)
    head = drain(first, sizes[:stop_after])
    # Round-trip through JSON, as a checkpoint does.
    saved = json.loads(json.dumps(first.state_dict()))
    resumed = GlobalBatchSampler(13, seed=5)
    resumed.load_state_dict(saved)
    assert head + drain(resumed, sizes[stop_after:]) == reference
    via_ctor = GlobalBatchSampler(13, seed=5, state=SamplerState(**saved))
    assert head + drain(via_ctor, sizes[stop_after:]) == reference


def test_bad_state_rejected():
    with pytest.raises(ValueError, match="position"):
        GlobalBatchSampler(5, seed=0, state=SamplerState(epoch=0, position=5))


# ---- sharding -----------------------------------------------------------------


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batch_size", [1, 2])
def test_shard_union_is_batch(dp_size, micro_batch_size):
    batch = GlobalBatchSampler(100, seed=0).next_global_batch(24)
    pieces = []
    for rank in range(dp_size):
        micro = shard_global_batch(
            batch, dp_rank=rank, dp_size=dp_size, micro_batch_size=micro_batch_size
        )
        assert all(len(m) == micro_batch_size for m in micro)
        pieces.extend(item for m in micro for item in m)
    assert pieces == batch


@pytest.mark.parametrize(
    "size, dp_size, micro, message",
    [(10, 3, 1, "data-parallel size"), (12, 3, 3, "micro_batch_size"), (12, 0, 1, "dp_size")],
)
def test_shard_errors(size, dp_size, micro, message):
    with pytest.raises(ValueError, match=message):
        shard_global_batch(list(range(size)), dp_rank=0, dp_size=dp_size, micro_batch_size=micro)


def test_world_size_change_mid_epoch_sees_each_sample_once():
    num_samples, batch_size = 60, 6
    sampler = GlobalBatchSampler(num_samples, seed=2)
    seen = []

    def run_steps(sampler, steps, dp_size):
        for _ in range(steps):
            batch = sampler.next_global_batch(batch_size)
            for rank in range(dp_size):
                for micro in shard_global_batch(
                    batch, dp_rank=rank, dp_size=dp_size, micro_batch_size=1
                ):
                    seen.extend(micro)

    run_steps(sampler, 4, dp_size=2)
    # Restart with 3 ranks from the checkpointed cursor, mid-epoch.
    resumed = GlobalBatchSampler(num_samples, seed=2, state=SamplerState(**sampler.state_dict()))
    run_steps(resumed, 6, dp_size=3)
    assert len(seen) == num_samples == len(set(seen))
    assert {i for _, i in seen} == set(range(num_samples))


def test_collate_shapes_and_shift():
    ds = synthetic(seq_len=16)
    items = [(0, 3), (0, 7), (1, 3)]
    inputs, targets = collate(ds, items)
    assert inputs.shape == targets.shape == (3, 16)
    assert inputs.dtype == torch.long
    torch.testing.assert_close(inputs[0, 1:], targets[0, :-1])
    torch.testing.assert_close(targets[1], ds[7][1:])
    torch.testing.assert_close(inputs[2], ds[3][:-1])
