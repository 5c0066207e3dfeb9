"""The per-worker training loop: spec -> mesh -> model -> strategy -> data -> steps.

``train_fn`` (in ``workers.worker_entry``) is what Ray Train runs on each worker;
``run`` is the loop itself and also runs under ``torchrun`` (the benchmark
baseline), under ``torch.multiprocessing`` (the strategy matrix) or in one
plain process (the reference the equivalence tests compare against).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.schedule import SaveSchedule
from workers.checkpoint.state import ModelAndOptimizer
from workers.contract import EventKind, MetricPoint
from workers.data import GlobalBatchSampler, dataset_for
from workers.hooks import RunHooks
from workers.models.config import ModelConfig
from workers.models.hf_load import (
    load_device,
    load_pretrained,
    loads_before_strategy,
    materialize,
    spec_model_config,
)
from workers.models.llama import build_model
from workers.models.lora import hold_frozen_linears_in, init_lora, inject_lora
from workers.spec import JobSpec, TrainSpec
from workers.stepper import Stepper, loss_fn
from workers.storage.location import StorageLocation, stores_for
from workers.strategies import StrategyConfig, get_strategy
from workers.strategies.mesh import build_mesh, coordinates
from workers.telemetry.memory import ActivationMeter, memory_report
from workers.telemetry.reporter import TelemetryReporter
from workers.telemetry.tensorboard import with_tensorboard


@dataclass
class RunEnv:
    """Where this process sits and where its job's state lives."""

    rank: int
    world_size: int
    device: torch.device
    # Where the job's checkpoints (and TensorBoard's event files) live, resolved once by
    # whoever starts the loop (workers.worker_entry: the job's folder of its storage).
    checkpoints: StorageLocation | None = None
    reporter: TelemetryReporter | None = None
    # Stop after this step although the spec runs longer (drills, benchmarks, tests).
    stop_at: int | None = None
    # Called once, after this run's first step (Ray: top up warm spare workers).
    after_first_step: Callable[[], object] | None = None
    # Installed by tests and drills (fault injection); None in production.
    hooks: RunHooks | None = None
    # Measure memory at the first step (a new run or a resize): False only for tests and
    # benchmarks that do not read it (the meter traces every op of that step).
    measure_memory: bool = True

    def __post_init__(self) -> None:
        if self.checkpoints is not None and not isinstance(self.checkpoints, StorageLocation):
            raise TypeError(
                "RunEnv.checkpoints is a StorageLocation (workers.storage.location.locate "
                f"turns a path or URI into one), not {type(self.checkpoints).__name__}"
            )


@dataclass
class RunResult:
    """What a finished run leaves behind (used by tests and the benchmarks)."""

    losses: dict[int, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    resumed_from: int | None = None
    parts: list[nn.Module] = field(default_factory=list)
    memory: list[dict] | None = None  # per-rank memory measured at the first step

    @property
    def model(self) -> nn.Module | None:
        """The trained module when this rank holds the whole model in one part."""
        return self.parts[0] if len(self.parts) == 1 else None


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


def _split_and_apply(spec: JobSpec, env: RunEnv, model: nn.Module, mesh):
    """Model parts for this rank after the strategy, and the pipeline if pp > 1.

    Ordering constraint: split into pipeline stages first, then apply TP and
    data-parallel sharding to each stage's part, then build the schedule.
    """
    if mesh is None:
        return [model], None
    cfg = StrategyConfig(parallelism=spec.parallelism, precision=spec.train.precision)
    apply = get_strategy(spec.parallelism.strategy)
    if spec.parallelism.pp == 1:
        return [apply(model, mesh=mesh, cfg=cfg)], None
    from workers.strategies.pp import build_pipeline, split_model

    stages = [
        (i, apply(part, mesh=mesh, cfg=cfg)) for i, part in split_model(model, mesh=mesh, cfg=cfg)
    ]
    pipeline = build_pipeline(
        stages,
        mesh=mesh,
        cfg=cfg,
        loss_fn=loss_fn,
        device=env.device,
        calls_per_step=pipeline_calls(spec, env.world_size),
    )
    return [part for _, part in stages], pipeline


def pipeline_calls(spec: JobSpec, world_size: int) -> int:
    """Schedule calls per optimizer step (each takes ``microbatches`` micro-batches)."""
    t, mb = spec.train, spec.parallelism.pipeline.microbatches
    return t.global_batch_size // (spec.data_parallel_size(world_size) * t.micro_batch_size * mb)


def _stores(spec: JobSpec):
    """How model.hf, model.tokenizer and data.path are reached (:func:`stores_for`)."""
    return stores_for(spec.stores)


def _new_model(
    spec: JobSpec, env: RunEnv, cfg: ModelConfig | None = None
) -> tuple[nn.Module, ModelConfig | None]:
    """A preset initialised from the seed, or (model.hf) an empty meta model and its config.
    ``cfg``: the job's model shape when the caller has it (else read from the spec)."""
    cfg = cfg or spec_model_config(spec, _stores(spec))
    if spec.model.hf is None:
        return build_model(cfg, seed=spec.train.seed, device=str(env.device)), None
    return build_model(cfg, seed=spec.train.seed, device="meta"), cfg


def _load_hf(spec: JobSpec, env: RunEnv, parts: list[nn.Module], cfg: ModelConfig) -> None:
    for part in parts:
        materialize(part, device=load_device(spec, env.device))
    load_pretrained(parts, spec.model.hf, cfg, stores=_stores(spec))


def _build(spec: JobSpec, env: RunEnv, dataset, cfg: ModelConfig) -> tuple[Stepper, list]:
    torch.manual_seed(spec.train.seed)
    model, pretrained = _new_model(spec, env, cfg)
    model.checkpoint_blocks = spec.model.activation_checkpointing
    if spec.model.lora is not None:  # adapters in, base frozen: before the strategy wraps it
        inject_lora(model, spec.model.lora)
        if spec.train.precision == "bf16":  # no fp32 master copy of what never trains
            hold_frozen_linears_in(model, torch.bfloat16)
    mesh = build_mesh(spec, world_size=env.world_size, device=env.device)
    early = pretrained is not None and loads_before_strategy(spec, mesh)
    if early:  # the layout replicates the whole model on every rank
        _load_hf(spec, env, [model], pretrained)
    parts, pipeline = _split_and_apply(spec, env, model, mesh)
    if pretrained is not None and not early:  # each rank reads only its shards
        _load_hf(spec, env, parts, pretrained)
    if spec.model.lora is not None:  # seeded, layout-independent: after the base is in place
        init_lora(parts, seed=spec.train.seed)
    optimizers = [build_optimizer(p, train=spec.train) for p in parts]
    schedulers = [
        torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_factor(s, train=spec.train))
        for o in optimizers
    ]
    stepper = Stepper(
        parts=parts,
        optimizers=optimizers,
        dataset=dataset,
        coords=coordinates(mesh),
        device=env.device,
        micro_batch_size=spec.train.micro_batch_size,
        microbatches=spec.parallelism.pipeline.microbatches,
        precision=spec.train.precision,
        grad_clip=spec.train.grad_clip,
        pipeline=pipeline,
    )
    return stepper, schedulers


def _restore(
    ckpts: CheckpointManager, stepper: Stepper, schedulers, sampler
) -> tuple[int, dict | None]:
    """Load the newest committed checkpoint, if any; (step to start at, its manifest extra)."""
    info = ckpts.latest()
    if info is None:
        return 0, None
    extra = ckpts.load(info, app_state=ModelAndOptimizer(stepper.parts, stepper.optimizers))
    for sched in schedulers:
        sched.load_state_dict(extra["scheduler"])
    sampler.load_state_dict(extra["sampler"])
    return info.step, extra


def _dataset(spec: JobSpec, cfg: ModelConfig):
    """The job's dataset (its items depend on the spec alone, never on the world size);
    file sources are tokenized with model.tokenizer (else model.hf's) when there is one;
    object-store ones are reached with the checkpoint section's store options."""
    return dataset_for(
        spec.data,
        tokenizer=spec.model.tokenizer or spec.model.hf,
        vocab_size=cfg.vocab_size,
        seed=spec.train.seed,
        stores=_stores(spec),
    )


def _checkpoints(spec: JobSpec, env: RunEnv) -> CheckpointManager | None:
    """This rank's manager of the run's checkpoints, with the job's retention rule."""
    if env.checkpoints is None:
        return None
    return CheckpointManager(
        env.checkpoints,
        keep_last=spec.checkpoint.keep_last,
        rank=env.rank,
        keep_every=spec.checkpoint.keep_every,
    )


def run(spec: JobSpec, env: RunEnv) -> RunResult:
    """Train ``spec`` from its newest committed checkpoint (or from scratch) to the end."""
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    cfg = spec_model_config(spec, _stores(spec))  # read once: model.hf may be remote
    dataset = _dataset(spec, cfg)
    stepper, schedulers = _build(spec, env, dataset, cfg)
    sampler = GlobalBatchSampler(len(dataset), seed=spec.train.seed)
    ckpts = _checkpoints(spec, env)
    start, restored = _restore(ckpts, stepper, schedulers, sampler) if ckpts else (0, None)
    env, tb = with_tensorboard(spec.metrics.tensorboard, env, start=start)
    saving = SaveSchedule(spec, env, ckpts, restored_extra=restored)
    result = RunResult(resumed_from=start or None, parts=stepper.parts)
    _announce_start(env, start, (restored or {}).get("world_size"))
    last = min(spec.train.steps, env.stop_at or spec.train.steps)
    measure = _measures_memory(env, start=start, restored=restored)
    for step in range(start + 1, last + 1):
        t0 = time.perf_counter()
        batch = sampler.next_global_batch(spec.train.global_batch_size)
        first = step == start + 1
        stepper.meter = _meter(stepper) if first and measure else None
        loss, (due_votes, done_votes) = stepper.step(batch, votes=saving.votes())
        if first:
            result.memory = _report_memory(env, stepper) if measure else None
            if env.after_first_step is not None:
                env.after_first_step()
        stepper.zero_grad()
        for sched in schedulers:
            sched.step()
        dt = time.perf_counter() - t0
        if env.hooks is not None:  # tests: injected faults, after dt so step times stay real
            env.hooks.after_step(step=step, rank=env.rank)
        result.losses[step] = loss
        result.step_times.append(dt)
        _emit_metric(
            spec,
            env,
            step=step,
            loss=loss,
            dt=dt,
            stepper=stepper,
            sampler=sampler,
            dataset_len=len(dataset),
        )
        saving.after_step(
            step=step,
            dt=dt,
            due_votes=due_votes,
            done_votes=done_votes,
            stepper=stepper,
            extra=lambda: {
                "scheduler": schedulers[0].state_dict(),
                "sampler": sampler.state_dict(),
                "world_size": env.world_size,
                **saving.extra_state(),
            },
        )
    saving.close()
    tb.close()
    return result


def _meter(stepper: Stepper) -> ActivationMeter:
    return ActivationMeter(stepper.parts, pipeline=stepper.pipeline is not None)


def _measures_memory(env: RunEnv, *, start: int, restored: dict | None) -> bool:
    """Whether this group measures its memory at its first step: a new run, or a restore
    at another world size. The meter traces every op of that step (about 1 s for gpt-tiny
    on one CPU core), and a group restarted at the size that saved the checkpoint holds what
    the group of that size measured before it (the same on every rank: one manifest)."""
    if not env.measure_memory:
        return False
    return start == 0 or (restored or {}).get("world_size") != env.world_size


def _report_memory(env: RunEnv, stepper: Stepper) -> list[dict]:
    """Gather every rank's measured memory; rank 0 reports it as a ``memory`` event."""
    mine = memory_report(stepper.parts, stepper.optimizers, stepper.meter, env.device)
    ranks: list = [mine]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    if env.rank == 0 and env.reporter is not None:
        env.reporter.event(
            EventKind.MEMORY,
            "per-rank memory measured at the first step",
            data={"ranks": ranks},
            dedup_key=f"memory:{uuid.uuid4().hex[:12]}",
        )
    return ranks


def _announce_start(env: RunEnv, start: int, saved_world: int | None) -> None:
    if env.rank != 0 or env.reporter is None:
        return
    nonce = uuid.uuid4().hex[:12]
    env.reporter.event(
        EventKind.WORKERS_STARTED,
        f"{env.world_size} workers started",
        data={"world_size": env.world_size},
        dedup_key=f"start:{nonce}",
    )
    if start:
        # Ray Train's controller reports the resize itself ("resized 4 → 2 (node
        # lost)", workers.elastic.scaling); this says where the new group picked up.
        moved = (
            f" (saved by {saved_world} workers, now {env.world_size})"
            if saved_world is not None and saved_world != env.world_size
            else ""
        )
        env.reporter.event(
            EventKind.RESTORED,
            f"restored from step {start}{moved}",
            data={"step": start, "world_size": env.world_size, "saved_world_size": saved_world},
            dedup_key=f"restore:{nonce}",
        )


def _emit_metric(
    spec: JobSpec,
    env: RunEnv,
    *,
    step: int,
    loss: float,
    dt: float,
    stepper: Stepper,
    sampler: GlobalBatchSampler,
    dataset_len: int,
) -> None:
    if env.rank != 0 or env.reporter is None:
        return
    g = spec.train.global_batch_size
    cursor = sampler.state_dict()
    env.reporter.metric(
        MetricPoint(
            step=step,
            ts=time.time(),
            loss=loss,
            lr=stepper.optimizers[0].param_groups[0]["lr"],
            grad_norm=stepper.grad_norm,
            samples_per_s=g / dt,
            tokens_per_s=g * spec.data.seq_len / dt,
            world_size=env.world_size,
            step_time_s=dt,
            epoch=cursor["epoch"],
            epoch_position=cursor["position"],
            epoch_size=dataset_len,
        )
    )
