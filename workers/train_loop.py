"""The per-worker training loop: spec -> mesh -> model -> strategy -> data -> steps.

``train_fn`` (in ``workers.worker_entry``) is what Ray Train runs on each worker;
``run`` is the loop itself and also runs under ``torchrun`` (the benchmark
baseline), under ``torch.multiprocessing`` (the strategy matrix) or in one
plain process (the reference the equivalence tests compare against).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from workers.build import build_stepper, stores_of
from workers.checkpoint.export_final import final_model_exporter
from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.schedule import SaveSchedule
from workers.contract import MetricPoint
from workers.data import GlobalBatchSampler, dataset_for
from workers.data.mixture import MixedDataset, sampler_for
from workers.data.packing import PackedDataset
from workers.evaluation import split_for_eval
from workers.hooks import RunHooks
from workers.models.config import ModelConfig
from workers.models.hf_load import spec_model_config
from workers.objectives import dataset_of, places_model, rows_of
from workers.spec import JobSpec
from workers.stepper import Stepper
from workers.storage.location import StorageLocation
from workers.telemetry.memory import ActivationMeter, memory_report
from workers.telemetry.outputs import with_outputs
from workers.telemetry.reporter import TelemetryReporter
from workers.telemetry.run_events import announce_start, gather_memory, report_early_stop


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
    # With the memory, trace the first step's activations: False counts only the state's
    # bytes (tests that read no activation figure skip the trace).
    trace_activations: bool = True

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
    eval_losses: dict[int, float] = field(default_factory=dict)
    metrics: dict[int, dict] = field(default_factory=dict)  # the objective's, by step
    stopped_early: int | None = None  # the step early stopping ended the run at
    step_times: list[float] = field(default_factory=list)
    resumed_from: int | None = None
    parts: list[nn.Module] = field(default_factory=list)
    memory: list[dict] | None = None  # per-rank memory measured at the first step

    def record(self, step: int, loss: float, dt: float, metrics: dict) -> None:
        """A step's loss, time and the objective's metrics (when it reports any)."""
        self.losses[step] = loss
        self.step_times.append(dt)
        if metrics:
            self.metrics[step] = dict(metrics)

    @property
    def model(self) -> nn.Module | None:
        """The trained module when this rank holds the whole model in one part."""
        return self.parts[0] if len(self.parts) == 1 else None


def _restore(
    ckpts: CheckpointManager, stepper: Stepper, schedulers, sampler
) -> tuple[int, dict | None]:
    """Load the newest committed checkpoint, if any; (step to start at, its manifest extra)."""
    info = ckpts.latest()
    if info is None:
        return 0, None
    extra = ckpts.load(info, app_state=stepper.app_state())
    for sched in schedulers:
        sched.load_state_dict(extra["scheduler"])
    sampler.load_state_dict(extra["sampler"])
    return info.step, extra


def _dataset(spec: JobSpec, cfg: ModelConfig | None, section=None, *, seed: int | None = None):
    """The job's dataset (data.sources: their mixture, a synthetic source's chain seeded by
    its place), or that of another data ``section``; its items depend on the spec alone,
    never on the world size. File sources are tokenized with model.tokenizer (else
    model.hf's) when there is one; object-store ones are reached with the spec's stores."""
    if section is None and spec.data.sources is not None:
        parts = [
            _dataset(spec, cfg, src, seed=spec.train.seed + 1 + i)
            for i, src in enumerate(spec.data.sources)
        ]
        return MixedDataset(parts, [src.weight for src in spec.data.sources])
    seed = spec.train.seed if seed is None else seed
    if cfg is None:  # the objective reads its own data (images with captions)
        return dataset_of(spec, section or spec.data, seed=seed)
    rows = dataset_for(
        section or spec.data,
        tokenizer=spec.model.tokenizer or spec.model.hf,
        vocab_size=cfg.vocab_size,
        seed=seed,
        stores=stores_of(spec),
    )
    return rows_of(spec, rows)  # the objective's items: a DPO pair is two samples


def _datasets(spec: JobSpec, cfg: ModelConfig | None):
    """``(the samples training walks, the held-out evaluation or None)``
    (:func:`workers.evaluation.split_for_eval`); with data.packing training walks packed
    rows of its samples (the evaluation set stays unpacked)."""
    train, evaluation = split_for_eval(
        spec, _dataset(spec, cfg), lambda section: _dataset(spec, cfg, section)
    )
    return (PackedDataset(train) if spec.data.packing else train), evaluation


def _model_config(spec: JobSpec) -> ModelConfig | None:
    """The decoder's shape, read once (model.hf may be remote); None when the objective
    builds its own model (a diffusers UNet)."""
    return None if places_model(spec) else spec_model_config(spec, stores_of(spec))


def _checkpoints(spec: JobSpec, env: RunEnv) -> CheckpointManager | None:
    """This rank's manager of the run's checkpoints, with the job's retention rule."""
    if env.checkpoints is None:
        return None
    return CheckpointManager(
        env.checkpoints,
        keep_last=spec.checkpoint.keep_last,
        rank=env.rank,
        keep_every=spec.checkpoint.keep_every,
        keep_best=spec.checkpoint.keep_best,
    )


def run(spec: JobSpec, env: RunEnv) -> RunResult:
    """Train ``spec`` from its newest committed checkpoint (or from scratch) to the end."""
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    cfg = _model_config(spec)
    dataset, evaluation = _datasets(spec, cfg)
    stepper, schedulers = build_stepper(spec, env, dataset, cfg)
    sampler = sampler_for(dataset, seed=spec.train.seed)
    ckpts = _checkpoints(spec, env)
    start, restored = _restore(ckpts, stepper, schedulers, sampler) if ckpts else (0, None)
    if evaluation is not None:
        evaluation.restore(restored)
    env, tb = with_outputs(spec, env, start=start, exporter=final_model_exporter(spec))
    saving = SaveSchedule(spec, env, ckpts, restored_extra=restored)
    result = RunResult(resumed_from=start or None, parts=stepper.parts)
    announce_start(env.reporter, env.rank, env.world_size, start, restored)
    last = min(spec.train.steps, env.stop_at or spec.train.steps)
    measure = _measures_memory(env, start=start, restored=restored)
    for step in range(start + 1, last + 1):
        t0 = time.perf_counter()
        batch = sampler.next_global_batch(spec.train.global_batch_size)
        first = step == start + 1
        stepper.measuring = first and measure
        stepper.meter = _meter(stepper) if stepper.measuring and env.trace_activations else None
        loss, (due_votes, done_votes) = stepper.step(batch, votes=saving.votes())
        if first:
            _after_first_step(env, stepper, result, measure=measure)
        stepper.zero_grad()
        for sched in schedulers:
            sched.step()
        dt = time.perf_counter() - t0
        if env.hooks is not None:  # tests: injected faults, after dt so step times stay real
            env.hooks.after_step(step=step, rank=env.rank)
        result.record(step, loss, dt, stepper.metrics)
        ended, evaluated = _evaluate(evaluation, step, stepper, result, env)
        _emit_metric(
            spec,
            env,
            step=step,
            loss=loss,
            dt=dt,
            stepper=stepper,
            sampler=sampler,
            dataset_len=len(dataset),
            ts=ended,
            evaluated=evaluated,
        )
        saving.after_step(
            step=step,
            dt=dt,
            due_votes=due_votes,
            done_votes=done_votes,
            stepper=stepper,
            extra=_manifest(env, schedulers, sampler, saving, evaluation, evaluated),
            final=result.stopped_early == step,
        )
        if result.stopped_early:
            break
    for done in (saving, tb, stepper):
        done.close()
    return result


def _report_memory(env: RunEnv, stepper: Stepper) -> list[dict]:
    frozen = stepper.objective.frozen_parts
    engine = stepper.engine.memory if stepper.engine is not None else None
    mine = memory_report(
        stepper.parts, stepper.optimizers, stepper.meter, env.device, frozen, state=engine
    )
    return gather_memory(mine, rank=env.rank, reporter=env.reporter)


def _after_first_step(env: RunEnv, stepper: Stepper, result: RunResult, *, measure: bool):
    result.memory = _report_memory(env, stepper) if measure else None
    if env.after_first_step is not None:
        env.after_first_step()


def _evaluate(
    evaluation, step: int, stepper: Stepper, result: RunResult, env: RunEnv
) -> tuple[float, dict]:
    """``(the step's end, the evaluation's metric fields)``: the held-out set is evaluated
    after the steps that do (else no fields), and its time is not the step's. Early stopping
    counts the evaluation and, when it ends the run here, sets ``result.stopped_early``."""
    ended = time.time()
    if evaluation is None or not evaluation.due(step):
        return ended, {}
    evaluated = evaluation.run(stepper)
    loss = result.eval_losses[step] = evaluated["eval_loss"]
    if evaluation.stopping is not None and evaluation.stopping.update(loss):
        result.stopped_early = step
        report_early_stop(env.reporter, env.rank, step, evaluation.stopping)
    return ended, evaluated


def _manifest(env: RunEnv, schedulers, sampler, saving, evaluation, evaluated: dict):
    """What a checkpoint of this step keeps beside the weights, made when it is taken."""
    return lambda: {
        "scheduler": schedulers[0].state_dict(),
        "sampler": sampler.state_dict(),
        "world_size": env.world_size,
        **saving.extra_state(),
        **(evaluation.manifest(evaluated) if evaluation is not None else {}),
    }


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
    ts: float | None = None,
    evaluated: dict | None = None,
) -> None:
    if env.rank != 0 or env.reporter is None:
        return
    g = spec.train.global_batch_size
    cursor = sampler.state_dict()
    env.reporter.metric(
        MetricPoint(
            step=step,
            ts=ts or time.time(),
            loss=loss,
            lr=stepper.optimizers[0].param_groups[0]["lr"],
            grad_norm=stepper.grad_norm,
            samples_per_s=g / dt,
            tokens_per_s=g * stepper.objective.rows_per_item * spec.data.seq_len / dt,
            world_size=env.world_size,
            step_time_s=dt,
            epoch=cursor["epoch"],
            epoch_position=cursor["position"],
            epoch_size=dataset_len,
            **stepper.metrics,
            **(evaluated or {}),
        )
    )
