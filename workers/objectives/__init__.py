"""Training objectives: what one item of the data is, how items become a batch, and how a
batch becomes a loss (and the metrics it reports).

The strategies, the sampler, checkpoints, elastic resizing, evaluation and telemetry serve
every objective alike; an objective is one module here, named by ``objective`` in the spec
(:data:`workers.spec.objective.OBJECTIVES`: its data shapes and strategies). The module
gives:

- ``rows(spec, dataset)``: the items the sampler walks, from the samples of a data section
  (the identity for ``causal_lm``; pairs of samples for ``dpo``). An item is what must stay
  in one micro-batch on one rank;
- ``build(spec, parts, reference=...)``: an :class:`Objective` for this rank's model parts
  (``reference(folder)`` builds a frozen copy of the starting model, laid out like them).

An objective that trains a model other than etrain's decoder (``diffusion``: a diffusers
UNet) also gives ``place(spec, env, mesh)``, this rank's trained parts in the strategy's
layout, and ``dataset(spec, section, seed=...)``, the items of a data section; the loop
then asks it, not the decoder's builders (:func:`places_model`).

What the :class:`~workers.stepper.Stepper` asks of it is :class:`Objective`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn


class Objective(Protocol):
    """One objective for one rank (see the module docstring)."""

    # Metric fields it adds to each step's point (their sums over the global batch's
    # items, reduced with the loss, divided by the items): () for none.
    metric_fields: tuple[str, ...]
    rows_per_item: int  # sequences per item (a DPO pair is two)
    # Modules beside the trained ones, never trained, by name ("reference", "vae"): the
    # first step's memory report gives each one's bytes as ``<name>_bytes``.
    frozen_parts: dict[str, nn.Module]
    perplexity: bool  # whether exp(eval_loss) is a perplexity (reported as eval_perplexity)

    def batch(self, dataset, items: list, device: torch.device) -> Any:
        """The micro-batch of ``items`` (sampler items), on ``device``."""

    def prepare(self, model: nn.Module, batch) -> Any:
        """What the batch needs before the forward that trains, without gradients (a
        reference model's log-probabilities); the batch that :meth:`forward` takes."""

    def forward(self, model: nn.Module, batch) -> Any:
        """The forward pass that trains (under the step's autocast)."""

    def loss(self, out, batch, *, scale: float | None, n_calls: int):
        """``(the loss to backward, its share of the step's loss: float64, detached,
        the metric sums as a float64 tensor or None)``. ``scale``: dp_size / the items'
        count for masked data (sum, times it), else None (mean, over ``n_calls``)."""

    def eval_batch(self, dataset, items: list, *, seq_len: int, device: torch.device) -> Any:
        """An evaluation micro-batch (``items`` may end in None: padding that counts 0)."""

    def eval_sum(self, model: nn.Module, batch) -> torch.Tensor:
        """The batch's summed loss (float64), without gradients."""


def _module(spec):
    return importlib.import_module(f"workers.objectives.{spec.objective}")


def rows_of(spec, dataset):
    """The items of ``dataset`` (a data section's samples) that the objective trains on."""
    return _module(spec).rows(spec, dataset)


def places_model(spec) -> bool:
    """Whether the spec's objective builds its own model and data (see the module
    docstring)."""
    return hasattr(_module(spec), "place")


def place(spec, env, mesh) -> list[nn.Module]:
    """This rank's trained parts, from an objective that :func:`places_model`."""
    return _module(spec).place(spec, env, mesh)


def dataset_of(spec, section, *, seed: int):
    """The items of data ``section``, from an objective that :func:`places_model`."""
    return _module(spec).dataset(spec, section, seed=seed)


def objective_for(
    spec, parts: list[nn.Module], *, reference: Callable[[str | None], nn.Module]
) -> Objective:
    """The spec's objective for this rank's model ``parts``."""
    return _module(spec).build(spec, parts, reference=reference)
