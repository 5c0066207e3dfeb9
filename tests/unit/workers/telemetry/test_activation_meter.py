"""The activation meter (workers.telemetry.memory): live activation storages at the peak,
a checkpointed block's recompute included, frozen (LoRA) parameters tolerated."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from service.planner.memory_model import FP32, Layout, Workload, activation_bytes
from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.telemetry.memory import ActivationMeter

CFG = get_model_config("gpt-small")
BATCH, SEQ = 2, 32


def _measure(mode, *, freeze: bool = False) -> int:
    model = build_model(CFG, seed=0)
    model.checkpoint_blocks = mode
    if freeze:  # a frozen base, as LoRA leaves it: torch's tracker must not hook these
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("tok_embeddings"))
    tokens = torch.randint(
        0, CFG.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)
    )
    meter = ActivationMeter([model])
    with meter:
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return meter.peak


def test_the_meter_sees_recompute_and_matches_the_plan():
    logits = FP32 * BATCH * SEQ * CFG.vocab_size  # held to the end of backward
    work = Workload(cfg=CFG, seq_len=SEQ, micro_batch_size=BATCH, global_batch_size=BATCH)
    for mode in ("none", "full", "selective"):
        planned = activation_bytes(work, Layout("ddp", dp=1), checkpointed=mode) + logits
        measured = _measure(mode)
        assert abs(measured - planned) <= 0.1 * planned, (mode, measured, planned)
    assert _measure("full") < _measure("selective") < _measure("none")


def test_frozen_parameters_do_not_break_the_meter():
    assert 0 < _measure("none", freeze=True) < _measure("none")
