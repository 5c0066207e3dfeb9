"""Job-style checkpoints for the generation tests, committed in the test's process as a
job's checkpoint manager commits them."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.state import ModelAndOptimizer

LORA = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def save_checkpoint(model: torch.nn.Module, root: Path, *, step: int, extra: dict) -> str:
    """Commit ``model`` (its trainable parameters, with an optimizer's state) as a job's
    checkpoint manager does; its URI."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    state = ModelAndOptimizer([model], [opt])
    info = CheckpointManager(root, keep_last=None, rank=0).save(
        step=step, app_state=state, extra=extra
    )
    return info.uri


@torch.no_grad()
def perturb(model: torch.nn.Module, *, seed: int, only=lambda name: True) -> None:
    """Move the selected parameters off their values, as training would."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if only(name):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
