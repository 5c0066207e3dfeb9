"""What a pipeline stage holds at its peak, as measured in
tests/integration/test_activation_memory.py: the saved tensors of the micro-batches in
flight, the stage's output for each (the schedule keeps it until that micro-batch's
backward), the head and logits of one micro-batch (GPipe: of all), and its input in a
receive buffer (one per micro-batch), which is a buffer, not an activation."""

from __future__ import annotations

from service.planner.activations import (
    FP32,
    layer_activation_bytes_per_token,
    root_activation_bytes_per_token,
)
from service.planner.memory_model import (
    Layout,
    Workload,
    activation_bytes,
    buffer_bytes,
    logits_in_flight,
)
from workers.models.config import get_model_config

CFG = get_model_config("gpt-small")  # 4 layers: 2 per stage at pp=2
WORK = Workload(cfg=CFG, seq_len=32, micro_batch_size=2, global_batch_size=4)
TOKENS = 64
LAYER = layer_activation_bytes_per_token(CFG, tp=1, precision="fp32") * TOKENS
EDGE = FP32 * CFG.dim * TOKENS  # one micro-batch's stage output (or input)
LOGITS = FP32 * TOKENS * CFG.vocab_size


def _pp(schedule: str, m: int = 2) -> Layout:
    return Layout("pp", dp=1, pp=2, schedule=schedule, microbatches=m)


def _root(first: bool, last: bool) -> int:
    return root_activation_bytes_per_token(CFG, first, last, WORK) * TOKENS


def test_first_stage_keeps_its_output_per_micro_batch_in_flight():
    for schedule in ("1f1b", "gpipe"):  # 2 micro-batches in flight on stage 0 either way
        got = activation_bytes(WORK, _pp(schedule), pp_rank=0, checkpointed="none")
        assert got == 2 * (2 * LAYER + EDGE) + _root(True, False) * logits_in_flight(_pp(schedule))


def test_last_stage_input_is_a_receive_buffer_and_gpipe_holds_every_head():
    one = activation_bytes(WORK, _pp("1f1b"), pp_rank=1, checkpointed="none")
    assert one == 2 * LAYER - EDGE + _root(False, True)  # one micro-batch in flight
    every = activation_bytes(WORK, _pp("gpipe"), pp_rank=1, checkpointed="none")
    assert every == 2 * (2 * LAYER - EDGE + _root(False, True))
    assert buffer_bytes(WORK, _pp("gpipe"), pp_rank=1)["logits_grad"] == 2 * LOGITS
    assert buffer_bytes(WORK, _pp("1f1b"), pp_rank=1)["logits_grad"] == LOGITS


def test_full_recompute_under_gpipe_meets_the_other_heads():
    """The first recompute in backward runs while the other micro-batches' heads live."""
    again = LAYER - EDGE  # a block's recompute makes all it keeps but its input
    got = activation_bytes(WORK, _pp("gpipe"), pp_rank=1, checkpointed="full")
    kept = 2 * 2 * EDGE - 2 * EDGE  # block inputs of 2 micro-batches; one is received
    assert got == kept + again + _root(False, True)
    got_1f1b = activation_bytes(WORK, _pp("1f1b"), pp_rank=1, checkpointed="full")
    assert got_1f1b == 2 * EDGE - EDGE + again


def test_receive_buffers_one_per_micro_batch_and_direction():
    for m in (2, 4):
        first = buffer_bytes(WORK, _pp("1f1b", m), pp_rank=0)["pipeline_p2p"]
        assert first == m * EDGE  # gradients in only
    middle = Layout("pp", dp=1, pp=4, microbatches=4)
    assert buffer_bytes(WORK, middle, pp_rank=1)["pipeline_p2p"] == 2 * 4 * FP32 * CFG.dim * 64
