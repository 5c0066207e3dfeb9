"""The planner's memory model: state by strategy, activations, buffers, host memory."""

from __future__ import annotations

import dataclasses

import pytest

from service.planner.memory_model import (
    Layout,
    Workload,
    activation_bytes,
    buffer_bytes,
    layer_activation_bytes_per_token,
    rank_memory,
    stage_layer_counts,
    state_bytes,
    state_bytes_by_rank,
    worst_rank_memory,
)
from workers.models.config import count_params, get_model_config

SMALL = get_model_config("gpt-small")
N = count_params(SMALL)


def _work(**kw) -> Workload:
    base = {"cfg": SMALL, "seq_len": 32, "micro_batch_size": 2, "global_batch_size": 8}
    return Workload(**{**base, **kw})


@pytest.mark.parametrize(
    ("optimizer", "momentum", "per_param"), [("adamw", 0.0, 8), ("sgd", 0.9, 4), ("sgd", 0.0, 0)]
)
def test_ddp_state_is_the_whole_model(optimizer, momentum, per_param):
    s = state_bytes(_work(optimizer=optimizer, momentum=momentum), Layout("ddp", dp=4))
    assert (s.params, s.grads, s.optimizer) == (4 * N, 4 * N, per_param * N)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_fsdp_shards_all_state_at_every_zero_stage(zero_stage):
    # FSDP2 has no optimizer-only mode: stages 1 and 2 shard like 3 and differ in buffers.
    layout = Layout("fsdp", dp=4, zero_stage=zero_stage)
    assert state_bytes(_work(), layout).params == 4 * N // 4
    gathered = buffer_bytes(_work(), layout)["fsdp_all_gather"]
    assert gathered == (4 * N if zero_stage < 3 else pytest.approx(4 * N * 0.35, rel=0.5))


def test_fsdp_shards_follow_torch_chunk_on_uneven_rows():
    # dp = 3 does not divide 256 rows: chunks of 86, 86, 84.
    ranks = state_bytes_by_rank(_work(), Layout("fsdp", dp=3))
    assert sum(r.params for r in ranks) == 4 * N
    assert ranks[0].params == ranks[1].params > ranks[2].params


def test_offload_moves_state_to_the_host_on_gpu_only():
    layout = Layout("fsdp", dp=2, cpu_offload=True)
    gpu = rank_memory(_work(on_gpu=True), layout)
    assert gpu.device_state.total == 0 and gpu.host == gpu.state.total
    cpu = rank_memory(_work(on_gpu=False), layout)
    assert cpu.device_state.total == cpu.state.total and cpu.host == 0


def test_async_checkpoint_stages_params_and_optimizer_on_the_host():
    m = rank_memory(_work(async_checkpoint=True), Layout("ddp", dp=2))
    assert m.detail["host"]["async_checkpoint_staging"] == 4 * N + 8 * N


def test_stage_split_matches_the_worker_split():
    from workers.strategies import pp

    for preset in ("gpt-small", "llama-1b", "llama-70b"):
        cfg = get_model_config(preset)
        for stages in (2, 4, 8):
            if stages <= cfg.n_layers:
                assert list(stage_layer_counts(cfg, stages)) == [
                    len(r) for r in pp.stage_layer_ranges(cfg, stages)
                ]


def test_pipeline_ranks_hold_their_stages():
    ranks = state_bytes_by_rank(_work(), Layout("pp", dp=1, pp=2, microbatches=2))
    assert sum(r.params for r in ranks) == 4 * N
    inter = state_bytes_by_rank(
        _work(), Layout("pp", dp=1, pp=2, schedule="interleaved_1f1b", microbatches=2)
    )
    assert sum(r.params for r in inter) == 4 * N


def test_activations_per_token_of_gpt_small_fp32():
    """Counted tensor by tensor from autograd's saved tensors of one block (flash attention)."""
    h, f, a = 256, 688, 8
    norms = 2 * (3 * 4 * h + 4)  # input, 1/rms, normalised output (also the projections' input)
    attention = 4 * 4 * h + 4 * a  # q, k and v (GQA repeated to all heads), output, logsumexp
    ffn = 4 * 4 * f
    assert layer_activation_bytes_per_token(SMALL, tp=1, precision="fp32") == (
        norms + attention + ffn
    )


def test_tp_splits_projections_but_not_norms():
    one = layer_activation_bytes_per_token(SMALL, tp=1, precision="bf16")
    two = layer_activation_bytes_per_token(SMALL, tp=2, precision="bf16")
    assert one / 2 < two < one


def test_pipeline_activations_by_schedule():
    """Rank 0 holds all micro-batches under GPipe, min(microbatches, pp) under 1F1B."""
    work = _work(global_batch_size=16)

    def first(schedule: str, m: int) -> int:
        return activation_bytes(
            work, Layout("pp", dp=1, pp=4, schedule=schedule, microbatches=m), pp_rank=0
        )

    assert first("gpipe", 8) == pytest.approx(2 * first("1f1b", 8), rel=1e-3)
    assert first("1f1b", 8) == pytest.approx(2 * first("1f1b", 2), rel=1e-3)
    last = activation_bytes(work, Layout("pp", dp=1, pp=4, microbatches=8), pp_rank=3)
    assert last < first("1f1b", 8) / 2  # one micro-batch in flight on the last stage


def test_interleaving_holds_more_in_flight_than_1f1b():
    work = _work(global_batch_size=32)
    plain = activation_bytes(work, Layout("pp", dp=1, pp=2, microbatches=16))
    inter = activation_bytes(
        work, Layout("pp", dp=1, pp=2, schedule="interleaved_1f1b", microbatches=16)
    )
    assert inter > plain


def test_activation_checkpointing_keeps_only_block_inputs():
    cfg = get_model_config("llama-7b")
    work = Workload(
        cfg=cfg, seq_len=4096, micro_batch_size=1, global_batch_size=8, precision="bf16"
    )
    full = activation_bytes(work, Layout("fsdp", dp=8))
    ckpt = activation_bytes(work, Layout("fsdp", dp=8), checkpointed=True)
    assert ckpt < full / 5
    on = dataclasses.replace(work, activation_checkpointing=True)
    assert rank_memory(on, Layout("fsdp", dp=8)).activations == ckpt


def test_bf16_without_fsdp_holds_autocast_weight_copies():
    cfg = get_model_config("gpt-tiny")
    work = Workload(cfg=cfg, seq_len=32, micro_batch_size=2, global_batch_size=4, precision="bf16")
    linear = count_params(cfg) - cfg.vocab_size * cfg.dim - (2 * cfg.n_layers + 1) * cfg.dim
    assert buffer_bytes(work, Layout("ddp", dp=2))["autocast_weight_copies"] == 2 * linear
    assert "autocast_weight_copies" not in buffer_bytes(work, Layout("fsdp", dp=2))


def test_worst_rank_is_the_largest_device_total():
    work = _work(global_batch_size=16)
    lay = Layout("pp", dp=1, pp=4, microbatches=8)
    worst = worst_rank_memory(work, lay)
    assert worst.device_total == max(
        rank_memory(work, lay, pp_rank=r).device_total for r in range(4)
    )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_worst_rank_measures_few_ranks_and_finds_the_one_a_full_scan_finds(schedule, mode):
    """A config.json of 1,024 layers on pp 1,024 measured every rank of 88 layouts: 1 s."""
    big = dataclasses.replace(SMALL, n_layers=24)
    for pp, microbatches in [(2, 1), (3, 4), (4, 8), (5, 5), (6, 12), (8, 2)]:
        if schedule == "interleaved_1f1b" and 2 * pp > big.n_layers:
            continue
        work = _work(cfg=big, activation_checkpointing=mode, global_batch_size=2 * microbatches)
        lay = Layout("pp", dp=1, pp=pp, schedule=schedule, microbatches=microbatches)
        every = [rank_memory(work, lay, pp_rank=r) for r in range(pp)]
        scan = max(every, key=lambda m: (m.device_total, m.host))
        assert worst_rank_memory(work, lay) == scan, (pp, microbatches)


def _dpo_spec(**over):
    from workers.spec import JobSpec

    spec = {
        "name": "dpo",
        "objective": "dpo",
        "model": {"preset": "gpt-small"},
        "data": {"source": "jsonl", "path": "/d/p.jsonl", "shape": "preference", "seq_len": 32},
        "resources": {"workers": 4},
        "train": {"global_batch_size": 8, "micro_batch_size": 2},
        **over,
    }
    return JobSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("parallelism", "share"),
    [({"strategy": "ddp"}, 1), ({"strategy": "fsdp", "fsdp": {"zero_stage": 3}}, 4)],
)
def test_dpo_counts_its_reference_model_and_both_answers(parallelism, share):
    """A frozen copy beside the trained model (whole under DDP, sharded like it under FSDP);
    each pair is two sequences in the micro-batch; with LoRA the base is the reference."""
    from service.planner.planning import layout_of, workload_of

    spec = _dpo_spec(parallelism=parallelism)
    work, layout = workload_of(spec), layout_of(spec, 4)
    sft = dataclasses.replace(work, micro_batch_size=2, global_batch_size=8, reference_model=False)
    buffers = buffer_bytes(work, layout)
    assert buffers["dpo_reference_model"] == pytest.approx(4 * N / share, rel=0.01)
    assert activation_bytes(work, layout) == 2 * activation_bytes(sft, layout)
    lora = _dpo_spec(parallelism=parallelism, model={"preset": "gpt-small", "lora": {"rank": 8}})
    assert "dpo_reference_model" not in buffer_bytes(workload_of(lora), layout)
