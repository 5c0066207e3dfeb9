"""Parallel strategies: small model-agnostic modules, one ``apply_<name>`` each.

A strategy takes a plain model (or, under pipeline parallelism, one stage's
part of it) and the ("pp", "dp", "tp") device mesh and returns the module the
train loop steps. The registry maps ``parallelism.strategy`` names
(``workers.contract.STRATEGIES``, which the spec and the planner also use) to
them; it refuses to load when the two differ. :mod:`.mesh` builds the
("pp", "dp", "tp") device mesh every strategy works on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.contract import STRATEGIES
from workers.spec import ParallelismSpec


@dataclass(frozen=True)
class StrategyConfig:
    """The slice of a job spec that strategies read."""

    parallelism: ParallelismSpec
    precision: Literal["fp32", "bf16"] = "fp32"


class ApplyStrategy(Protocol):
    """Signature every strategy implements."""

    def __call__(self, model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
        """Return the model prepared for this strategy on ``mesh``."""


_REGISTRY: dict[str, ApplyStrategy] = {}


def register_strategy(name: str) -> Callable[[ApplyStrategy], ApplyStrategy]:
    """Decorator: make ``fn`` the implementation of strategy ``name``."""

    def wrap(fn: ApplyStrategy) -> ApplyStrategy:
        _REGISTRY[name] = fn
        return fn

    return wrap


def get_strategy(name: str) -> ApplyStrategy:
    """Return the apply function for ``name`` or raise ValueError listing what exists."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"parallelism.strategy {name!r} is not available; use one of {sorted(_REGISTRY)}"
        ) from None


def _load_builtin() -> None:
    # Imported lazily so that registering does not depend on import order.
    from workers.strategies import ddp, fsdp, hybrid, pp, tp  # noqa: F401

    if set(_REGISTRY) != set(STRATEGIES):
        raise RuntimeError(
            f"strategies registered {sorted(_REGISTRY)} differ from "
            f"workers.contract.STRATEGIES {sorted(STRATEGIES)}"
        )
