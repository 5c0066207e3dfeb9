"""The optimizer and learning-rate schedule a job's ``train`` section asks for."""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.spec import TrainSpec


def build_optimizer(model: nn.Module, *, train: TrainSpec) -> torch.optim.Optimizer:
    """AdamW or SGD over the model's parameters, as the spec says."""
    params = [p for p in model.parameters() if p.requires_grad]
    if train.optimizer == "adamw":
        return torch.optim.AdamW(
            params, lr=train.lr, weight_decay=train.weight_decay, foreach=False
        )
    return torch.optim.SGD(
        params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay, foreach=False
    )


def lr_factor(step: int, *, train: TrainSpec) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at the last step."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    span = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    floor = train.min_lr_ratio
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
