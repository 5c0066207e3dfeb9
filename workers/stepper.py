"""One optimizer step: this rank's share of the global batch, accumulation, the global loss.

Two shapes of step share the same bookkeeping: a data-parallel step (DDP,
FSDP, TP and their hybrids run forward and backward over micro-batches) and a
pipeline step (a ``torch.distributed.pipelining`` schedule runs micro-batches
through the stages). Either way each optimizer step consumes exactly the
spec's global batch, and the reported loss is that batch's mean.
"""

from __future__ import annotations

import contextlib
import math
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from workers.checkpoint.deepspeed_state import app_state
from workers.checkpoint.state import ModelAndOptimizer
from workers.data import counted_labels, shard_global_batch
from workers.objectives import Objective
from workers.objectives.causal_lm import CausalLM, loss_fn, masked_loss_sum
from workers.strategies.deepspeed import EngineStep
from workers.strategies.mesh import Coordinates, total_grad_norm
from workers.telemetry.memory import ActivationMeter


class Pipeline(Protocol):
    """What the loop needs of a pipeline (``workers.strategies.pp`` builds it)."""

    has_first: bool
    has_last: bool
    # None: the loss is the token mean; else each micro-batch's summed loss times this.
    token_scale: float | None

    def run(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        """Forward and backward one batch in micro-batches; the mean loss on the last stage."""

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip gradients by their global norm over all stages; return that norm."""

    def evaluate(self, inputs: torch.Tensor | None, targets: torch.Tensor | None):
        """Forward one batch without backward; the summed masked loss on the last stage
        (float64), None elsewhere."""


__all__ = ["Pipeline", "Stepper", "loss_fn", "masked_loss_sum"]


class Stepper:
    """Runs optimizer steps for one rank.

    Every rank that computes the loss (all ranks without pipelining, the last
    stage with it) contributes ``loss / holders`` to one all-reduce, which also
    carries votes any rank may cast (a save is due; its async writes are done) at no
    extra cost.
    """

    def __init__(
        self,
        *,
        parts: list[nn.Module],
        optimizers: list[torch.optim.Optimizer],
        dataset,
        coords: Coordinates,
        device: torch.device,
        micro_batch_size: int,
        microbatches: int,
        precision: str,
        grad_clip: float,
        pipeline: Pipeline | None = None,
        objective: Objective | None = None,
        engine: EngineStep | None = None,
    ):
        self.parts, self.optimizers, self.dataset = parts, optimizers, dataset
        self.engine = engine  # strategy deepspeed: its engine runs backward and the step
        self.objective = objective or CausalLM()
        self.coords, self.device, self.pipeline = coords, device, pipeline
        self.micro_batch_size, self.grad_clip = micro_batch_size, grad_clip
        # A pipeline call takes `microbatches` micro-batches at once.
        self.per_call = micro_batch_size * (microbatches if pipeline is not None else 1)
        self.holds_loss = pipeline is None or pipeline.has_last
        self.holders = coords.dp_size * coords.tp_size
        self.autocast = torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=precision == "bf16"
        )
        # Set for the step whose memory is measured: the engine records what it holds,
        # and the meter, if any, traces the step's activations.
        self.measuring = False
        self.meter: ActivationMeter | None = None
        # The global gradient norm of the last step, before any clipping (its metric point).
        self.grad_norm: float | None = None
        # The objective's metrics of the last step (its metric_fields: means over the items).
        self.metrics: dict[str, float] = {}

    def step(self, batch: list, *, votes: tuple[bool, ...] = ()) -> tuple[float, tuple[int, ...]]:
        """One optimizer step on this rank's share of ``batch``.

        Returns the global mean loss and, per vote, how many ranks voted yes. When the
        dataset masks labels (instruction, chat) that mean is over the global batch's
        counted labels: each micro-batch's summed loss is scaled by dp_size / (counted
        labels of the global batch), which every rank counts from the dataset alone, so
        the step is the same for any world size and micro-batch split (data-parallel
        gradients are averaged over dp, hence the dp_size).
        """
        counted = counted_labels(self.dataset, batch)
        scale = None if counted is None else self.coords.dp_size / max(counted, 1)
        calls = self._calls(batch)
        # The step's loss (and the objective's metric sums) stay on the device until the one
        # reduce per step: a float() per micro-batch would wait for the device each time.
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        sums = torch.zeros(len(self.objective.metric_fields), dtype=torch.float64)
        sums = sums.to(self.device)
        for i, items in enumerate(calls):
            batch_i = self.objective.batch(self.dataset, items, self.device)
            last = i == len(calls) - 1
            if self.pipeline is not None:
                loss = self._pipeline_call(batch_i[0], batch_i[1], len(calls), scale)
            else:
                loss, metric_sums = self._micro_step(batch_i, len(calls), sync=last, scale=scale)
                if metric_sums is not None:
                    sums += metric_sums
            if loss is not None:
                local += loss
        norm = self._update()
        mean, counts = self._reduce(local, votes, sums, items=len(batch))
        self.grad_norm = float(norm)  # after the reduce, which waits for the device anyway
        return mean, counts

    def evaluate(self, dataset, items: list, *, count: int, seq_len: int) -> float:
        """The mean loss over an evaluation set: ``items`` (``eval_set.eval_items``, the same
        on every rank), this rank's contiguous share forwarded without gradients, in eval
        mode (no dropout), each loss summed over its counted labels; one all-reduce of the
        sums (one replica per data-parallel shard: the last stage's tp rank 0), divided by
        ``count``. Optimizer, gradients and sampler are untouched."""
        calls = self._calls(items)
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        modes = [part.training for part in self.parts]
        for part in self.parts:
            part.eval()
        try:
            with torch.no_grad(), self.autocast:
                for call in calls:
                    batch = self.objective.eval_batch(
                        dataset, call, seq_len=seq_len, device=self.device
                    )
                    loss = self._eval_call(batch)
                    if loss is not None:
                        local += loss
        finally:
            for part, mode in zip(self.parts, modes, strict=True):
                part.train(mode)
                if isinstance(part, FSDPModule):
                    part.reshard()  # the root stays gathered after a forward
        if dist.is_initialized():
            if not (self.holds_loss and self.coords.tp_rank == 0):
                local.zero_()
            dist.all_reduce(local)
        return float(local) / max(count, 1)

    def _calls(self, batch: list) -> list[list]:
        """This rank's contiguous share of ``batch``, in calls of ``per_call`` items."""
        return shard_global_batch(
            batch,
            dp_rank=self.coords.dp_rank,
            dp_size=self.coords.dp_size,
            micro_batch_size=self.per_call,
        )

    def _eval_call(self, batch) -> torch.Tensor | None:
        if self.pipeline is not None:
            x, y = batch[0], batch[1]
            return self.pipeline.evaluate(
                x if self.pipeline.has_first else None, y if self.pipeline.has_last else None
            )
        model = self.parts[0]
        # DDP's own forward would broadcast its buffers on every call: nothing to sync here.
        model = model.module if isinstance(model, DistributedDataParallel) else model
        return self.objective.eval_sum(model, batch)

    def close(self) -> None:
        """The run has ended on this rank (a DeepSpeed engine removes its swap files)."""
        if self.engine is not None:
            self.engine.close()

    def zero_grad(self) -> None:
        """Drop gradients (after any memory measurement of the step; a DeepSpeed engine
        drops its own in its step)."""
        if self.engine is not None:
            return
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def _micro_step(self, batch, n_calls: int, *, sync: bool, scale: float | None):
        """Forward and backward one micro-batch; ``(its share of the step's loss: float64,
        on the device, the objective's metric sums or None)``."""
        model = self.parts[0]
        with self.autocast:  # outside the meter, which follows one forward per step
            batch = self.objective.prepare(model, batch)
        syncing = contextlib.nullcontext() if self.engine else _grad_sync(model, sync)
        with syncing, self.meter or contextlib.nullcontext():
            with self.autocast:
                out = self.objective.forward(model, batch)
            if self.meter is not None:
                self.meter.note_resident_params(self.parts)
            loss, share, metric_sums = self.objective.loss(out, batch, scale=scale, n_calls=n_calls)
            if self.engine is not None:
                self.engine.backward(loss, last=sync)
            else:
                loss.backward()
        return share, metric_sums

    def _pipeline_call(self, x, y, n_calls: int, scale: float | None) -> float | None:
        # The pipeline's loss function divides by the number of calls per step
        # (fixed when it is built), so gradients summed over calls are the mean;
        # with masked labels it scales each summed loss by token_scale instead.
        self.pipeline.token_scale = scale
        with self.autocast, self.meter or contextlib.nullcontext():
            loss = self.pipeline.run(
                x if self.pipeline.has_first else None, y if self.pipeline.has_last else None
            )
        return None if loss is None else loss / n_calls

    def app_state(self):
        """What a checkpoint of this rank holds (DCP app state): model and optimizer state
        under layout-independent names."""
        if self.engine is not None:
            return app_state(self.engine.engine)
        return ModelAndOptimizer(self.parts, self.optimizers)

    def _update(self) -> torch.Tensor:
        """The optimizer step; the global gradient norm before any clipping."""
        if self.engine is not None:
            return self.engine.step(measure=self.measuring)
        norm = self._clip()
        for opt in self.optimizers:
            opt.step()
        return norm

    def _clip(self) -> torch.Tensor:
        """The global gradient norm; gradients are clipped to train.grad_clip when it is > 0."""
        if self.pipeline is not None:
            # Each pipeline rank holds other layers: the norm must span all stages.
            return self.pipeline.clip_grad_norm_(self.grad_clip or math.inf)
        params = [p for part in self.parts for p in part.parameters() if p.grad is not None]
        norm = total_grad_norm(params)
        if self.grad_clip > 0:
            # foreach=False: one fused multiply cannot mix DTensors of different meshes.
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm, foreach=False)
        return norm

    def _reduce(
        self, local: torch.Tensor, votes: tuple[bool, ...], sums: torch.Tensor, *, items: int
    ) -> tuple[float, tuple[int, ...]]:
        """The global loss and vote counts; the objective's metrics (sums over the global
        batch's items, one copy per tp group, over its items) into ``self.metrics``."""
        flags = torch.tensor([float(v) for v in votes], dtype=torch.float64, device=local.device)
        if dist.is_initialized():
            share = local / self.holders if self.holds_loss else torch.zeros_like(local)
            buf = torch.cat([share.reshape(1), flags, sums / self.coords.tp_size])
            dist.all_reduce(buf)
        else:
            buf = torch.cat([local.reshape(1), flags, sums])
        fields = self.objective.metric_fields
        if fields:
            values = buf[1 + len(votes) :].tolist()
            self.metrics = {f: v / items for f, v in zip(fields, values, strict=True)}
        return float(buf[0]), tuple(round(float(v)) for v in buf[1 : 1 + len(votes)])


@contextlib.contextmanager
def _grad_sync(model: nn.Module, sync: bool):
    """Skip gradient communication on all but the last micro-batch of a step."""
    if hasattr(model, "no_sync") and not sync:  # DDP
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    yield
