"""Strategy helpers that need no second process: registry, ZeRO mapping, FSDP options, TP plans."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

from workers.contract import STRATEGIES
from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.spec import FsdpSpec, ParallelismSpec
from workers.strategies import StrategyConfig, get_strategy
from workers.strategies.fsdp import (
    apply_fsdp,
    decoder_blocks,
    fully_shard_options,
    reshard_after_forward,
)
from workers.strategies.hybrid import apply_hybrid
from workers.strategies.mesh import MESH_DIMS
from workers.strategies.tp import _check_divisible, apply_tp, block_plan


@pytest.fixture
def mesh(tmp_path):
    """A one-process gloo group and its (1, 1, 1) mesh; torn down so other tests see no group."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=MESH_DIMS)
    finally:
        dist.destroy_process_group()


def _cfg(*, precision: str = "fp32", **fsdp) -> StrategyConfig:
    return StrategyConfig(
        parallelism=ParallelismSpec(strategy="fsdp", fsdp=FsdpSpec(**fsdp)), precision=precision
    )


def test_registry_holds_the_strategies():
    assert get_strategy("fsdp") is apply_fsdp
    assert get_strategy("tp") is apply_tp
    assert get_strategy("hybrid") is apply_hybrid


def test_registry_holds_every_strategy_the_spec_accepts():
    import workers.strategies as strategies

    assert all(callable(get_strategy(name)) for name in STRATEGIES)
    assert set(strategies._REGISTRY) == set(STRATEGIES)


def test_registry_refuses_to_load_when_it_differs_from_the_contract(monkeypatch):
    import workers.strategies as strategies

    monkeypatch.setitem(strategies._REGISTRY, "zero-bubble", apply_fsdp)
    with pytest.raises(RuntimeError, match="zero-bubble"):
        get_strategy("ddp")


def test_registry_refuses_an_unknown_strategy_naming_the_field():
    with pytest.raises(ValueError, match=re.escape("parallelism.strategy 'zero-bubble'")):
        get_strategy("zero-bubble")


@pytest.mark.parametrize(("stage", "reshard"), [(3, True), (2, False), (1, False)])
def test_zero_stage_maps_to_reshard_after_forward(stage, reshard):
    assert reshard_after_forward(FsdpSpec(zero_stage=stage)) is reshard


def test_fsdp_options_follow_precision_and_offload(mesh):
    plain = fully_shard_options(dp_mesh=mesh["dp"], cfg=_cfg())
    assert "mp_policy" not in plain
    assert not isinstance(plain["offload_policy"], CPUOffloadPolicy)
    bf16 = fully_shard_options(dp_mesh=mesh["dp"], cfg=_cfg(precision="bf16", cpu_offload=True))
    assert bf16["mp_policy"].param_dtype == torch.bfloat16
    assert bf16["mp_policy"].reduce_dtype == torch.float32
    assert isinstance(bf16["offload_policy"], CPUOffloadPolicy)
    assert bf16["offload_policy"].pin_memory is False  # no pinned memory without an accelerator


@pytest.mark.parametrize("apply", [apply_fsdp, apply_tp, apply_hybrid])
def test_one_rank_dimensions_leave_the_model_plain(mesh, apply):
    model = build_model(get_model_config("gpt-tiny"), seed=0)
    out = apply(model, mesh=mesh, cfg=_cfg())
    assert out is model
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())


def test_decoder_blocks_of_a_pipeline_part():
    model = build_model(get_model_config("gpt-tiny"), seed=0)
    del model.layers["0"]
    model.tok_embeddings = None
    assert decoder_blocks(model) == [model.layers["1"]]
    assert decoder_blocks(torch.nn.Linear(2, 2)) == []


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp_plan_names_exist_in_a_block(sequence_parallel, gemma):
    # Gemma 3's block adds per-head q/k norms and post-attention / post-MLP norms.
    extra = {"qk_norm": True, "sandwich_norm": True, "norm_offset": 1.0} if gemma else {}
    cfg = dataclasses.replace(get_model_config("gpt-tiny"), **extra)
    block = build_model(cfg, seed=0).layers["0"]
    plan = block_plan(sequence_parallel=sequence_parallel, qk_norm=gemma, sandwich_norm=gemma)
    assert ("attention.q_norm" in plan) is gemma
    for name in plan:
        assert block.get_submodule(name) is not None  # AttributeError for a stale name


def test_tp_refuses_to_split_a_head():
    block = build_model(get_model_config("gpt-tiny"), seed=0).layers["0"]
    _check_divisible(block, 2)  # 4 query heads, 2 KV heads, 128 FFN units
    with pytest.raises(ValueError, match=re.escape("parallelism.tp")):
        _check_divisible(block, 4)  # 2 KV heads cannot be split four ways
