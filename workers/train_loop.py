"""The per-worker training loop: spec -> mesh -> model -> strategy -> data -> steps.

``train_fn`` is what Ray Train runs on each worker; ``run`` is the loop itself
and also runs under ``torchrun`` (the benchmark baseline) or in one plain
process (the reference the equivalence tests compare against).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from workers.checkpoint import CheckpointInfo, CheckpointManager, ModelAndOptimizer
from workers.faults import maybe_kill_worker
from workers.data import GlobalBatchSampler, build_dataset, collate, shard_global_batch
from workers.models import build_model, get_model_config
from workers.spec import JobSpec, TrainSpec
from workers.strategies import get_strategy
from workers.telemetry import TelemetryReporter


@dataclass
class RunEnv:
    """Where this process sits and where its job's state lives."""

    rank: int
    world_size: int
    device: torch.device
    checkpoint_root: str | None
    reporter: TelemetryReporter | None = None
    # Called on every rank after a committed checkpoint (Ray Train registration).
    on_checkpoint: Callable[[CheckpointInfo | None, dict], None] | None = None


@dataclass
class RunResult:
    """What a finished run leaves behind (used by tests and the benchmark)."""

    losses: dict[int, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    resumed_from: int | None = None
    model: nn.Module | None = None


def build_optimizer(model: nn.Module, *, train: TrainSpec) -> torch.optim.Optimizer:
    """AdamW or SGD over the model's parameters, as the spec says."""
    params = [p for p in model.parameters() if p.requires_grad]
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay,
                                 foreach=False)
    return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum,
                           weight_decay=train.weight_decay, foreach=False)


def lr_factor(step: int, *, train: TrainSpec) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at the last step."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    span = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    floor = train.min_lr_ratio
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_mesh(spec: JobSpec, *, world_size: int, device: torch.device) -> DeviceMesh | None:
    """The device mesh for this world size; None when running as one plain process."""
    if not dist.is_initialized():
        return None
    dp = spec.data_parallel_size(world_size)
    return init_device_mesh(device.type, (dp,), mesh_dim_names=("dp",))


def _build(spec: JobSpec, env: RunEnv):
    torch.manual_seed(spec.train.seed)
    model = build_model(get_model_config(spec.model.preset), seed=spec.train.seed,
                        device=str(env.device))
    mesh = build_mesh(spec, world_size=env.world_size, device=env.device)
    if mesh is not None:
        model = get_strategy(spec.parallelism.strategy)(model, mesh=mesh, cfg=spec.parallelism)
    optimizer = build_optimizer(model, train=spec.train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, train=spec.train))
    return model, optimizer, scheduler


def _restore(ckpts: CheckpointManager, model, optimizer, scheduler, sampler) -> int:
    """Load the newest committed checkpoint, if any; return the step to start at."""
    info = ckpts.latest()
    if info is None:
        return 0
    extra = ckpts.load(info, app_state=ModelAndOptimizer(model, optimizer))
    scheduler.load_state_dict(extra["scheduler"])
    sampler.load_state_dict(extra["sampler"])
    return info.step


def run(spec: JobSpec, env: RunEnv) -> RunResult:
    """Train ``spec`` from its newest committed checkpoint (or from scratch) to the end."""
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    model, optimizer, scheduler = _build(spec, env)
    mcfg = get_model_config(spec.model.preset)
    dataset = build_dataset(source=spec.data.source, path=spec.data.path,
                            seq_len=spec.data.seq_len, num_samples=spec.data.num_samples,
                            vocab_size=mcfg.vocab_size, seed=spec.train.seed)
    sampler = GlobalBatchSampler(len(dataset), seed=spec.train.seed)
    ckpts = (CheckpointManager(env.checkpoint_root, keep_last=spec.checkpoint.keep_last,
                               rank=env.rank) if env.checkpoint_root else None)
    start = _restore(ckpts, model, optimizer, scheduler, sampler) if ckpts else 0
    result = RunResult(resumed_from=start or None, model=model)
    _announce_start(spec, env, start)
    stepper = _Stepper(spec, env, model, optimizer, dataset)
    last_save = time.monotonic()
    for step in range(start + 1, spec.train.steps + 1):
        t0 = time.perf_counter()
        batch = sampler.next_global_batch(spec.train.global_batch_size)
        due_by_time = _due_by_time(spec, last_save)
        loss, save_now = stepper.step(batch, flag=due_by_time)
        maybe_kill_worker(step=step, rank=env.rank)
        scheduler.step()
        dt = time.perf_counter() - t0
        result.losses[step] = loss
        result.step_times.append(dt)
        _emit_metric(spec, env, step=step, loss=loss, dt=dt,
                     lr=optimizer.param_groups[0]["lr"], sampler=sampler, dataset_len=len(dataset))
        if ckpts and (save_now or _due_by_steps(spec, step)):
            _save(ckpts, env, step=step, model=model, optimizer=optimizer,
                  extra={"scheduler": scheduler.state_dict(), "sampler": sampler.state_dict()},
                  loss=loss)
            last_save = time.monotonic()
    return result


def _due_by_steps(spec: JobSpec, step: int) -> bool:
    every = spec.checkpoint.every_steps
    return step == spec.train.steps or bool(every and step % every == 0)


def _due_by_time(spec: JobSpec, last_save: float) -> bool:
    every = spec.checkpoint.every_seconds
    return bool(every and time.monotonic() - last_save >= every)


class _Stepper:
    """One optimizer step: micro-batches, gradient accumulation, the global mean loss."""

    def __init__(self, spec: JobSpec, env: RunEnv, model, optimizer, dataset):
        self.spec, self.env, self.model, self.optimizer, self.dataset = (
            spec, env, model, optimizer, dataset)
        self.dp_size = spec.data_parallel_size(env.world_size)
        self.dp_rank = env.rank  # DDP: every rank is its own dp rank
        self.autocast = torch.autocast(env.device.type, dtype=torch.bfloat16,
                                       enabled=spec.train.precision == "bf16")

    def step(self, batch: list, *, flag: bool) -> tuple[float, bool]:
        """Run one optimizer step on this rank's share of ``batch``.

        Returns the loss averaged over the whole global batch, and whether any
        rank raised ``flag`` (used to agree on time-based checkpoints without
        an extra collective).
        """
        micro = shard_global_batch(batch, dp_rank=self.dp_rank, dp_size=self.dp_size,
                                   micro_batch_size=self.spec.train.micro_batch_size)
        local = torch.zeros((), dtype=torch.float64)
        for i, items in enumerate(micro):
            x, y = (t.to(self.env.device, non_blocking=True) for t in collate(self.dataset, items))
            sync = i == len(micro) - 1
            ctx = contextlib.nullcontext() if sync or not hasattr(self.model, "no_sync") \
                else self.model.no_sync()
            with ctx:
                with self.autocast:
                    logits = self.model(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                (loss / len(micro)).backward()
            local += loss.detach().double() / len(micro)
        if self.spec.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._reduce(local, flag)

    def _reduce(self, local: torch.Tensor, flag: bool) -> tuple[float, bool]:
        if not dist.is_initialized():
            return float(local), flag
        buf = torch.stack([local, torch.tensor(float(flag), dtype=torch.float64)])
        dist.all_reduce(buf)
        return float(buf[0]) / self.dp_size, bool(buf[1] > 0)


def _announce_start(spec: JobSpec, env: RunEnv, start: int) -> None:
    if env.rank != 0 or env.reporter is None:
        return
    nonce = uuid.uuid4().hex[:12]
    env.reporter.event("workers_started", f"{env.world_size} workers started",
                       data={"world_size": env.world_size}, dedup_key=f"start:{nonce}")
    if start:
        env.reporter.event("restored", f"restored from step {start}",
                           data={"step": start, "world_size": env.world_size},
                           dedup_key=f"restore:{nonce}")


def _emit_metric(spec: JobSpec, env: RunEnv, *, step: int, loss: float, dt: float, lr: float,
                 sampler: GlobalBatchSampler, dataset_len: int) -> None:
    if env.rank != 0 or env.reporter is None:
        return
    g = spec.train.global_batch_size
    cursor = sampler.state_dict()
    env.reporter.metric({
        "step": step, "ts": time.time(), "loss": loss, "lr": lr,
        "samples_per_s": g / dt, "tokens_per_s": g * spec.data.seq_len / dt,
        "world_size": env.world_size, "step_time_s": dt,
        "epoch": cursor["epoch"], "epoch_position": cursor["position"],
        "epoch_size": dataset_len,
    })


def _save(ckpts: CheckpointManager, env: RunEnv, *, step: int, model, optimizer,
          extra: dict, loss: float) -> None:
    t0 = time.perf_counter()
    info = ckpts.save(step=step, app_state=ModelAndOptimizer(model, optimizer), extra=extra)
    blocking = time.perf_counter() - t0
    if env.rank == 0 and env.reporter is not None:
        env.reporter.checkpoint(step=step, uri=f"file://{info.path}", nbytes=info.bytes,
                                save_s=info.save_s, blocking_s=blocking)
        env.reporter.event("checkpoint_saved", f"checkpoint saved at step {step}",
                           data={"step": step, "bytes": info.bytes, "save_s": info.save_s},
                           dedup_key=f"ckpt:{step}:{os.path.basename(info.path)}:{info.save_s}")
    if env.on_checkpoint is not None:
        env.on_checkpoint(info if env.rank == 0 else None, {"step": step, "loss": loss})
