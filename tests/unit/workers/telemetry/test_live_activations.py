"""LiveActivations, the pipeline ranks' activation meter, against torch's MemTracker
on a plain model: the same peak, and freed tensors leave the count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.telemetry.memory import ActivationMeter, LiveActivations

CFG = get_model_config("gpt-small")
BATCH, SEQ = 2, 32


def _tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=gen)


def _step(model, tokens) -> None:
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_live_activations_match_torchs_tracker(mode):
    model = build_model(CFG, seed=0)
    model.checkpoint_blocks = mode
    tokens = _tokens()
    peaks = {}
    for pipeline in (False, True):  # MemTracker, then LiveActivations
        meter = ActivationMeter([model], pipeline=pipeline)
        with meter:
            _step(model, tokens)
        peaks[pipeline] = meter.peak
        model.zero_grad(set_to_none=True)
    assert peaks[True] == pytest.approx(peaks[False], rel=0.01), peaks


def test_freed_activations_leave_the_count():
    model = build_model(CFG, seed=0)
    tokens = _tokens()
    with LiveActivations() as live:
        _step(model, tokens)
        one = live.peak
        _step(model, tokens)  # the first graph was freed by its backward: the peak stays
        after = live.live
    assert live.peak == pytest.approx(one, rel=0.01)
    assert after < 0.05 * one  # what is left: nothing of the steps' activations
    assert one > BATCH * SEQ * CFG.dim * 4 * CFG.n_layers  # it did count the blocks
