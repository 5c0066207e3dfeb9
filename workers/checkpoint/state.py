"""What a checkpoint holds for one rank: model and optimizer state under layout-independent
names, and the random-number generators' states."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


class ModelAndOptimizer(Stateful):
    """DCP app state: model parts and their optimizers under strategy-independent names.

    ``get_state_dict`` strips wrapper prefixes (DDP's ``module.``, FSDP's) and,
    with flattened optimizer state, keys every optimizer tensor by parameter
    FQN. Each rank contributes the keys of the parts it holds (one part, or
    its pipeline stages), which is what lets a checkpoint saved under one
    layout load under another.

    When some parameters are frozen (LoRA: the base), only what trains is
    saved and loaded (``ignore_frozen_params``): the frozen base is rebuilt
    from the job's spec, so a checkpoint holds the adapters and their
    optimizer state alone.
    """

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.parts, self.optimizers = parts, optimizers
        self.trainable_only = any(not p.requires_grad for part in parts for p in part.parameters())

    def _options(self, *, strict: bool = True) -> StateDictOptions:
        return StateDictOptions(
            flatten_optimizer_state_dict=True,
            ignore_frozen_params=self.trainable_only,
            strict=strict and not self.trainable_only,
        )

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state of every local part, keyed by parameter FQN."""
        model, optim = {}, {}
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            msd, osd = get_state_dict(part, opt, options=self._options())
            model.update(msd)
            optim.update(osd)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` produced (resharded to this layout by DCP)."""
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            set_state_dict(
                part,
                opt,
                model_state_dict=state_dict["model"],
                optim_state_dict=state_dict["optim"],
                options=self._options(strict=len(self.parts) == 1),
            )


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
