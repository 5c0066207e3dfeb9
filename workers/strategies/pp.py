"""Pipeline parallelism: contiguous layer stages run by a ``torch.distributed.pipelining`` schedule.

The model is split along ``layers`` (torchtitan naming: ``tok_embeddings``,
``layers`` keyed by the original index, ``norm``, ``output``), so every stage
keeps the full model's parameter names and checkpoints move between layouts.
Stages are balanced by parameter count; the first stage also holds the
embedding and the last the final norm and output projection. With the
interleaved 1F1B schedule each pp rank holds two virtual stages, ``r`` and
``r + pp``. Data parallelism inside a stage (pp x dp) is FSDP over the mesh's
``dp`` dimension.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from workers.models.config import ModelConfig, count_params
from workers.strategies import StrategyConfig, register_strategy
from workers.strategies.mesh import total_grad_norm

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
}
# Virtual stages per pp rank; schedules not listed run one stage per rank.
_STAGES_PER_RANK = {"interleaved_1f1b": 2}


def stages_per_rank(schedule: str) -> int:
    """Pipeline stages each pp rank holds under ``schedule``."""
    return _STAGES_PER_RANK.get(schedule, 1)


def stage_layer_ranges(cfg: ModelConfig, n_stages: int) -> list[range]:
    """Contiguous decoder-layer ranges, one per stage, balanced by parameter count.

    The first stage also carries the embedding and the last the final norm
    and output projection, so with a large vocabulary they get fewer layers.
    Blocks are all the same size, so placing one layer at a time on the
    currently lightest stage minimises the heaviest stage (and the spread).
    """
    if not 1 <= n_stages <= cfg.n_layers:
        raise ValueError(
            f"{n_stages} pipeline stages cannot split {cfg.n_layers} layers; use between 1 "
            f"and {cfg.n_layers} stages (reduce parallelism.pp, or use a deeper preset)"
        )
    # Every layer has the same parameters whatever its attention type: count them as full.
    one = count_params(dataclasses.replace(cfg, n_layers=1, layer_types=()))
    block = count_params(dataclasses.replace(cfg, n_layers=2, layer_types=())) - one
    embedding, head = cfg.vocab_size * cfg.dim, cfg.vocab_size * cfg.dim + cfg.dim
    extra = [0] * n_stages
    extra[0] += embedding
    extra[-1] += head
    counts = [1] * n_stages
    for _ in range(cfg.n_layers - n_stages):
        # Ties go to the earliest stage so the split is deterministic.
        lightest = min(range(n_stages), key=lambda s: extra[s] + counts[s] * block)
        counts[lightest] += 1
    starts = [sum(counts[:s]) for s in range(n_stages)]
    return [range(start, start + n) for start, n in zip(starts, counts, strict=True)]


def split_model(
    model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig
) -> list[tuple[int, nn.Module]]:
    """This pp rank's stages as ``(stage index, part)``, in stage order.

    Stage ``i`` of ``n`` goes to pp rank ``i % pp``: one stage per rank, or
    ``r`` and ``r + pp`` with interleaved 1F1B. Each part is a copy of
    ``model`` without the layers (and ends) other stages own; ``model`` is
    left as it was.
    """
    pp, rank = mesh["pp"].size(), mesh["pp"].get_local_rank()
    n_stages = pp * stages_per_rank(cfg.parallelism.pipeline.schedule)
    ranges = stage_layer_ranges(model.cfg, n_stages)
    return [
        (i, _stage_part(model, ranges[i], first=i == 0, last=i == n_stages - 1))
        for i in range(rank, n_stages, pp)
    ]


def _stage_part(model: nn.Module, layers: range, *, first: bool, last: bool) -> nn.Module:
    keep = {str(i) for i in layers}
    drop = [m for key, m in model.layers.items() if key not in keep]
    if not first:
        drop.append(model.tok_embeddings)
    if not last:
        drop += [model.norm, model.output]
    # deepcopy returns memo entries as they are: seeding it with None for the
    # dropped modules copies only this stage's parameters, so a rank never holds
    # more than the full model plus its own stages while splitting.
    part = copy.deepcopy(model, memo={id(m): None for m in drop})
    for key in [k for k in part.layers if k not in keep]:
        del part.layers[key]  # only the kept keys remain, so names match the full model
    return part


@register_strategy("pp")
def apply_pp(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """Prepare one pipeline stage's part: FSDP over ``dp`` when dp > 1, else as it is.

    The pipeline schedule itself is built afterwards by :func:`build_pipeline`.
    """
    dp_mesh = mesh["dp"]
    if dp_mesh.size() == 1:
        return model
    # Imported here: the pp-only layout (dp == 1) does not need FSDP at all.
    from workers.strategies.fsdp import shard_data_parallel

    return shard_data_parallel(model, dp_mesh=dp_mesh, cfg=cfg)


class StagePipeline:
    """The loop's ``Pipeline``: one schedule over this rank's stages.

    ``run`` passes the batch on the first stage and the targets on the last;
    other ranks only exchange activations and gradients. Losses inside the
    schedule are scaled by ``1 / (microbatches * calls_per_step)`` so that the
    gradients summed over one optimizer step are those of the mean loss.
    """

    def __init__(
        self,
        schedule,
        stages: list[PipelineStage],
        *,
        calls_per_step: int,
        pp_group: dist.ProcessGroup,
    ):
        self.schedule, self.stages, self.pp_group = schedule, stages, pp_group
        self.calls_per_step = calls_per_step
        # Set by the stepper per step: None for token-mean losses, else the factor that
        # turns a micro-batch's summed loss over counted labels into its share.
        self.token_scale: float | None = None
        self.has_first = any(s.is_first for s in stages)
        self.has_last = any(s.is_last for s in stages)
        self.summing = False  # set by evaluate: each loss is the plain masked sum

    def run(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        """Forward and backward one batch in micro-batches; its mean loss on the last stage."""
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        args = (inputs,) if self.has_first else ()
        # return_outputs=False: the last stage keeps no logits beyond the backward.
        self.schedule.step(
            *args, target=targets if self.has_last else None, losses=losses, return_outputs=False
        )
        if losses is None:
            return None
        # Each entry is ce_i / (microbatches * calls); the mean ce_i is sum * calls.
        return sum(float(x.detach()) for x in losses) * self.calls_per_step

    def evaluate(self, inputs: torch.Tensor | None, targets: torch.Tensor | None):
        """Forward one batch without backward (the schedule's ``eval``); the summed masked
        loss over its micro-batches on the last stage (float64), None elsewhere."""
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        args = (inputs,) if self.has_first else ()
        self.summing = True
        try:
            self.schedule.eval(
                *args,
                target=targets if self.has_last else None,
                losses=losses,
                return_outputs=False,
            )
        finally:
            self.summing = False
        if losses is None:
            return None
        return sum(x.detach().double() for x in losses)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip this rank's gradients by their norm over all stages; return that norm."""
        params = [p for s in self.stages for p in s.submod.parameters() if p.grad is not None]
        squared = total_grad_norm(params).detach().double().pow(2).to(self.stages[0].device)
        # Each pp rank holds different layers, so the squares add up across the group.
        dist.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt().float()
        if math.isfinite(max_norm):  # inf: the norm alone (a step's metric point)
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=False)
        return total


def build_pipeline(
    stages: list[tuple[int, nn.Module]],
    *,
    mesh: DeviceMesh,
    cfg: StrategyConfig,
    loss_fn,
    device: torch.device,
    calls_per_step: int,
) -> StagePipeline:
    """The schedule named by ``cfg.parallelism.pipeline.schedule`` over ``stages``.

    Shapes are inferred from the first micro-batch at the first call (the
    hidden states' size depends on the batch, which is not known here).
    """
    schedule_name = cfg.parallelism.pipeline.schedule
    pp_mesh = mesh["pp"]
    n_stages = pp_mesh.size() * stages_per_rank(schedule_name)
    group = pp_mesh.get_group()
    # get_mesh: should TP hand DTensors across a stage boundary, shape inference
    # rebuilds them on the matching slice of the job's one mesh.
    pstages = [
        PipelineStage(
            part,
            index,
            n_stages,
            device,
            group=group,
            get_mesh=lambda names, layout: mesh[tuple(names)],
        )
        for index, part in stages
    ]
    microbatches = cfg.parallelism.pipeline.microbatches
    loss_scale = microbatches * calls_per_step

    pipeline: StagePipeline | None = None  # bound below; read when the schedule runs

    def scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pipeline is not None and pipeline.summing:
            return _masked_loss_sum(output, target)
        if pipeline is not None and pipeline.token_scale is not None:
            return _masked_loss_sum(output, target) * pipeline.token_scale
        return loss_fn(output, target) / loss_scale

    # scale_grads=False: the schedule's own scaling divides the accumulated
    # .grad in place after every call, which would shrink earlier calls' share
    # again; the loss above carries the whole 1/(microbatches x calls) instead.
    multi = stages_per_rank(schedule_name) > 1
    schedule = SCHEDULES[schedule_name](
        pstages if multi else pstages[0],
        n_microbatches=microbatches,
        loss_fn=scaled_loss,
        scale_grads=False,
    )
    pipeline = StagePipeline(schedule, pstages, calls_per_step=calls_per_step, pp_group=group)
    return pipeline


def _masked_loss_sum(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """fp32 cross entropy summed over the labels that are not -100 (masked data)."""
    return F.cross_entropy(
        output.float().flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"
    )
