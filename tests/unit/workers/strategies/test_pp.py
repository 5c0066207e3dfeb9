"""Pipeline stage splitting: layer ranges balanced by parameters, and the parts per rank."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workers.models.config import PRESETS, count_params, get_model_config
from workers.models.llama import build_model
from workers.spec import ParallelismSpec, PipelineSpec
from workers.strategies import StrategyConfig
from workers.strategies.pp import split_model, stage_layer_ranges


def stage_params(cfg, ranges) -> list[int]:
    """Parameters per stage, counted independently of the implementation."""
    block = count_params(dataclasses.replace(cfg, n_layers=2)) - count_params(
        dataclasses.replace(cfg, n_layers=1)
    )
    sizes = [len(r) * block for r in ranges]
    sizes[0] += cfg.vocab_size * cfg.dim
    sizes[-1] += cfg.vocab_size * cfg.dim + cfg.dim
    return sizes


def naive(n_layers: int, n_stages: int) -> list[range]:
    """Equal layer counts, the remainder on the first stages."""
    base, rest = divmod(n_layers, n_stages)
    counts = [base + (s < rest) for s in range(n_stages)]
    starts = [sum(counts[:s]) for s in range(n_stages)]
    return [range(a, a + n) for a, n in zip(starts, counts, strict=True)]


def layouts(stage_counts) -> list[tuple[str, int]]:
    """(preset, stages) for every preset deep enough for that many stages."""
    return [
        (preset, n) for preset, cfg in PRESETS.items() for n in stage_counts if n <= cfg.n_layers
    ]


@pytest.mark.parametrize("preset, n_stages", layouts([1, 2, 3, 4, 8, 16]))
def test_every_layer_once_in_order(preset, n_stages):
    cfg = get_model_config(preset)
    ranges = stage_layer_ranges(cfg, n_stages)
    assert len(ranges) == n_stages
    assert all(len(r) >= 1 and r.step == 1 for r in ranges)
    assert [i for r in ranges for i in r] == list(range(cfg.n_layers))


@pytest.mark.parametrize("preset, n_stages", layouts([2, 3, 4, 8]))
def test_never_worse_than_equal_layer_counts(preset, n_stages):
    cfg = get_model_config(preset)
    assert max(stage_params(cfg, stage_layer_ranges(cfg, n_stages))) <= max(
        stage_params(cfg, naive(cfg.n_layers, n_stages))
    )


def test_big_vocab_puts_fewer_layers_on_the_ends():
    cfg = get_model_config("llama-1b")  # 128k vocab: embedding and output ~4 blocks each
    ranges = stage_layer_ranges(cfg, 4)
    counts = [len(r) for r in ranges]
    assert counts[0] < counts[1] and counts[-1] < counts[2], counts
    balanced = max(stage_params(cfg, ranges))
    assert balanced < 0.8 * max(stage_params(cfg, naive(cfg.n_layers, 4)))


def test_small_vocab_splits_evenly():
    cfg = get_model_config("gpt-small")
    assert stage_layer_ranges(cfg, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(cfg, 4) == [range(i, i + 1) for i in range(4)]


@pytest.mark.parametrize("n_stages", [0, 5])
def test_refuses_impossible_stage_counts(n_stages):
    with pytest.raises(ValueError, match="pipeline stages cannot split 4 layers"):
        stage_layer_ranges(get_model_config("gpt-small"), n_stages)


class _MeshDim:
    """The two calls split_model makes on ``mesh["pp"]``."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def get_local_rank(self) -> int:
        return self._rank


def split(model, *, pp: int, rank: int, schedule: str):
    cfg = StrategyConfig(
        parallelism=ParallelismSpec(
            strategy="pp", pp=pp, pipeline=PipelineSpec(schedule=schedule, microbatches=pp)
        )
    )
    return split_model(model, mesh={"pp": _MeshDim(pp, rank)}, cfg=cfg)


@pytest.mark.parametrize(
    "schedule, pp, expect",
    [
        ("1f1b", 2, {0: [(0, ["0", "1"])], 1: [(1, ["2", "3"])]}),
        ("gpipe", 4, {r: [(r, [str(r)])] for r in range(4)}),
        ("interleaved_1f1b", 2, {0: [(0, ["0"]), (2, ["2"])], 1: [(1, ["1"]), (3, ["3"])]}),
    ],
)
def test_split_model_gives_each_rank_its_stages(schedule, pp, expect):
    model = build_model(get_model_config("gpt-small"), seed=0)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    names: list[str] = []
    n_stages = sum(len(v) for v in expect.values())
    for rank in range(pp):
        stages = split(model, pp=pp, rank=rank, schedule=schedule)
        assert [(i, list(part.layers.keys())) for i, part in stages] == expect[rank]
        for i, part in stages:
            assert (part.tok_embeddings is not None) == (i == 0)
            assert (part.norm is not None) == (part.output is not None) == (i == n_stages - 1)
            for name, value in part.state_dict().items():
                assert torch.equal(value, full[name]), name
                assert value.data_ptr() != model.state_dict()[name].data_ptr(), name
            names += list(part.state_dict())
    # Original names, each held by exactly one stage, and the model left whole.
    assert sorted(names) == sorted(full)
    assert model.state_dict().keys() == full.keys()


def test_stages_chained_equal_the_full_model():
    model = build_model(get_model_config("gpt-small"), seed=0)
    stages = dict(
        stage
        for rank in range(2)
        for stage in split(model, pp=2, rank=rank, schedule="interleaved_1f1b")
    )
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    h = tokens
    for index in range(4):
        h = stages[index](h)
    assert torch.equal(h, model(tokens))
