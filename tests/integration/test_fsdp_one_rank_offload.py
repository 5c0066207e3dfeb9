"""FSDP with CPU offload on a single rank: the model is wrapped (state in host memory,
each block copied to the device for its compute) and trains exactly like one plain
process. This is how a model larger than one GPU (70B LoRA on 24 GB) fits on it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

LORA = {"rank": 4, "target_modules": ["q_proj", "v_proj"]}


def _spec(optimizer: str, *, lora: dict | None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "one-rank-offload",
            "model": {"preset": "gpt-tiny", "lora": lora},
            "data": {"seq_len": 16, "num_samples": 64},
            "parallelism": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
            "resources": {"workers": 1},
            "train": {
                "steps": 3,
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "lr": 1e-2,
                "optimizer": optimizer,
                "momentum": 0.9 if optimizer == "sgd" else 0.0,
            },
        }
    )


@pytest.fixture(scope="module")
def one_rank_group():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _env() -> RunEnv:
    return RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False)


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_one_rank_offload_is_wrapped_and_matches_one_process(one_rank_group, optimizer, lora):
    spec = _spec(optimizer, lora=lora)
    wrapped = run(spec, _env())
    assert isinstance(wrapped.parts[0], FSDPModule)
    dist.destroy_process_group()  # the reference: one plain process, no group, no wrapper
    try:
        plain = run(spec, _env())
    finally:
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    assert not isinstance(plain.parts[0], FSDPModule)
    assert wrapped.losses.keys() == plain.losses.keys()
    for step, loss in plain.losses.items():
        assert wrapped.losses[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step
