"""The planner's DeepSpeed ZeRO accounting: state by stage, buckets, offload, findings."""

from __future__ import annotations

import math

import pytest

from service.planner import plan_job
from service.planner.memory_model import buffer_bytes, rank_memory, state_bytes
from service.planner.planning import layout_of, workload_of
from service.planner.workload import block_tensors, embed_tensors, head_tensors
from tests.support.specs import spec
from workers.models.config import count_params, get_model_config
from workers.spec import parse_spec

SMALL = get_model_config("gpt-small")
N = count_params(SMALL)
BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size unless set


def _job(
    stage: int,
    *,
    dp: int = 2,
    optimizer: str = "adamw",
    gpu: bool = False,
    preset="gpt-small",
    **ds,
):
    body = spec(
        model={"preset": preset},
        data={"seq_len": 32},
        resources={"workers": dp, **({"gpus_per_worker": 1} if gpu else {})},
        parallelism={"strategy": "deepspeed", "deepspeed": {"zero_stage": stage, **ds}},
        train={"global_batch_size": 8, "micro_batch_size": 2, "optimizer": optimizer},
    )
    job = parse_spec(body)
    return workload_of(job), layout_of(job, dp)


def _tensors(cfg=SMALL) -> list[int]:
    shapes = [s for s, _ in embed_tensors(cfg) + head_tensors(cfg)]
    shapes += [s for s, _ in block_tensors(cfg)] * cfg.n_layers
    return [math.prod(s) for s in shapes]


@pytest.mark.parametrize(("optimizer", "k"), [("adamw", 8), ("sgd", 0)])
def test_state_by_stage_is_the_zero_papers_with_fp32_master_partitions(optimizer, k):
    """0 replicates; 1 and 2 partition gradients and optimizer state (+ the fp32 master
    copy); 3 partitions parameters too, keeping tensors under 1e5 elements whole."""
    got = {s: state_bytes(*_job(s, dp=4, optimizer=optimizer)) for s in (0, 1, 2, 3)}
    assert (got[0].params, got[0].grads, got[0].optimizer) == (4 * N, 4 * N, k * N)
    part = math.ceil(N / 4)
    for s in (1, 2):
        assert (got[s].params, got[s].grads, got[s].optimizer) == (4 * N, 4 * part, (k + 4) * part)
    sizes = _tensors()
    pieces = sum(math.ceil(n / 4) for n in sizes)
    kept = sum(n for n in sizes if n < 100_000)
    assert got[3].params == 4 * (pieces + kept) and got[3].grads == 4 * pieces
    assert 4 * N / 4 < got[3].params < 4 * N


def test_a_persistence_threshold_of_zero_partitions_every_tensor():
    work, layout = _job(3, dp=4, stage3_param_persistence_threshold=0)
    assert state_bytes(work, layout).params == 4 * sum(math.ceil(n / 4) for n in _tensors())


def test_the_reduce_bucket_follows_reduce_bucket_size_not_the_model():
    """Allocated in backward at stages 1-2 (twice with overlap_comm), kept at 3."""
    assert buffer_bytes(*_job(1))["deepspeed_reduce_bucket"] == 4 * BUCKET
    assert buffer_bytes(*_job(2, overlap_comm=True))["deepspeed_reduce_bucket"] == 8 * BUCKET
    assert buffer_bytes(*_job(3))["deepspeed_reduce_bucket"] == 4 * BUCKET
    assert buffer_bytes(*_job(3, reduce_bucket_size=5_000_000))["deepspeed_reduce_bucket"] == (
        4 * 5_000_000
    )
    assert "deepspeed_reduce_bucket" not in buffer_bytes(*_job(2, contiguous_gradients=False))
    zero0 = buffer_bytes(*_job(0))
    assert zero0["deepspeed_allreduce_bucket"] == 4 * N and "deepspeed_reduce_bucket" not in zero0
    assert buffer_bytes(*_job(3))["deepspeed_gathered_params"] > 0


def test_offload_moves_optimizer_and_parameter_partitions_to_the_host_on_gpus():
    work, layout = _job(3, gpu=True, offload_optimizer="cpu", offload_param="cpu")
    m = rank_memory(work, layout)
    part = sum(math.ceil(n / 2) for n in _tensors())
    assert m.offloaded and m.state.grads == 8 * part  # the partition and its host copy
    assert m.host_state.optimizer == m.state.optimizer == 12 * part
    assert m.host_state.params == 4 * part and m.host_state.grads == 4 * part
    assert m.device_state.optimizer == 0 and m.device_state.grads == 4 * part
    assert m.detail["host"]["cpu_offload_state"] == m.host_state.total
    # On the CPU host and device memory are one: the state is all "device".
    cpu = rank_memory(*_job(3, offload_optimizer="cpu", offload_param="cpu"))
    assert not cpu.offloaded and cpu.device_state == cpu.state


def test_nvme_swaps_the_large_pieces_and_the_optimizer_state_to_disk():
    """Pieces of one aio block (1 MiB) or more go to disk with their fp32 gradients, the
    optimizer state and master copy whole; the device holds what CPU offload leaves it."""
    both = {"offload_optimizer": "nvme", "offload_param": "nvme"}
    work, layout = _job(3, dp=4, gpu=True, preset="llama-1b", **both)
    assert layout.describe() == "deepspeed zero3 offload-optimizer-nvme offload-param-nvme dp=4"
    m = rank_memory(work, layout)
    sizes = _tensors(get_model_config("llama-1b"))
    pieces = [math.ceil(n / 4) for n in sizes]
    blocks = sum(math.ceil(p / 2**18) * 2**18 for p in pieces if 4 * p >= 2**20)
    assert blocks and any(4 * p < 2**20 for p in pieces)  # the norms' pieces stay
    assert m.disk == 2 * 4 * blocks + 12 * sum(pieces)
    assert m.host_state.optimizer == 0 and m.device_state.optimizer == 0
    cpu = rank_memory(*_job(3, dp=4, gpu=True, preset="llama-1b", offload_optimizer="cpu"))
    assert m.device_total <= cpu.device_total and cpu.disk == 0
    assert m.host < cpu.host


def test_the_plan_warns_when_the_reduce_bucket_outweighs_the_state_and_names_the_fix():
    def warnings(**ds):
        body = spec(
            model={"preset": "gpt-small"},
            resources={"workers": 2},
            parallelism={"strategy": "deepspeed", "deepspeed": {"zero_stage": 3, **ds}},
        )
        return plan_job(parse_spec(body)).warnings

    found = [w for w in warnings() if "reduce_bucket_size" in w]
    assert len(found) == 1 and f"about {SMALL.dim**2}" in found[0] and "1.9 GiB" in found[0]
    assert not [w for w in warnings(reduce_bucket_size=65536) if "reduce_bucket_size" in w]


def test_deepspeed_zero1_is_not_told_it_runs_as_fsdps_stage_2():
    body = spec(resources={"workers": 2}, parallelism={"strategy": "deepspeed", "deepspeed": {}})
    body["parallelism"]["deepspeed"]["zero_stage"] = 1
    plan = plan_job(parse_spec(body))
    assert not [w for w in plan.warnings if "fsdp.zero_stage" in w]
    assert plan.breakdown.layout == "deepspeed zero1 dp=2"
