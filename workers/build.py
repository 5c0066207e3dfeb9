"""A rank's model and its optimizer step, from the spec: the model (a seeded preset, or a
Hugging Face folder loaded shard by shard), LoRA, the strategy's layout, the optimizers
and the objective's parts (:mod:`workers.objectives`: a frozen reference model for DPO),
put together in a :class:`~workers.stepper.Stepper`.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.contract import DEEPSPEED
from workers.models.config import ModelConfig
from workers.models.hf_load import (
    hf_model_config,
    load_device,
    load_pretrained,
    loads_before_strategy,
    materialize,
    spec_model_config,
)
from workers.models.llama import build_model
from workers.models.lora import hold_frozen_linears_in, init_lora, inject_lora
from workers.objectives import objective_for, place, places_model
from workers.optim import build_optimizer, lr_factor
from workers.spec import JobSpec
from workers.spec.objective import reference_vocabulary_error
from workers.stepper import Stepper, loss_fn
from workers.storage.location import stores_for
from workers.strategies import StrategyConfig, get_strategy
from workers.strategies.deepspeed import undo_process_patches
from workers.strategies.mesh import build_mesh, coordinates

# ``env`` arguments below are the run's workers.train_loop.RunEnv (device, world size).


def split_and_apply(spec: JobSpec, env, model: nn.Module, mesh):
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


def stores_of(spec: JobSpec):
    """How model.hf, model.tokenizer and data.path are reached (:func:`stores_for`)."""
    return stores_for(spec.stores)


def new_model(
    spec: JobSpec, env, cfg: ModelConfig | None = None
) -> tuple[nn.Module, ModelConfig | None]:
    """A preset initialised from the seed, or (model.hf) an empty meta model and its config.
    ``cfg``: the job's model shape when the caller has it (else read from the spec)."""
    cfg = cfg or spec_model_config(spec, stores_of(spec))
    if spec.model.hf is None:
        return build_model(cfg, seed=spec.train.seed, device=str(env.device)), None
    return build_model(cfg, seed=spec.train.seed, device="meta"), cfg


def load_hf(spec: JobSpec, env, parts: list[nn.Module], cfg: ModelConfig, folder=None) -> None:
    """Fill the meta ``parts`` with the weights of ``folder`` (default model.hf)."""
    for part in parts:
        materialize(part, device=load_device(spec, env.device))
    load_pretrained(parts, folder or spec.model.hf, cfg, stores=stores_of(spec))


def placed_model(spec: JobSpec, env, mesh, cfg: ModelConfig, *, lora: bool = True):
    """``(this rank's parts, the pipeline or None)``: the model (seeded preset, or model.hf
    loaded shard by shard), LoRA in when ``lora`` and the spec has it, in the strategy's
    layout; adapters initialised."""
    torch.manual_seed(spec.train.seed)
    model, pretrained = new_model(spec, env, cfg)
    hf = pretrained is not None
    model.checkpoint_blocks = spec.model.activation_checkpointing
    lora = lora and spec.model.lora is not None
    if lora:  # adapters in, base frozen: before the strategy wraps it
        inject_lora(model, spec.model.lora)
        if spec.train.precision == "bf16":  # no fp32 master copy of what never trains
            hold_frozen_linears_in(model, torch.bfloat16)
    early = hf and loads_before_strategy(spec, mesh)
    if early:  # the layout replicates the whole model on every rank
        load_hf(spec, env, [model], cfg)
    parts, pipeline = split_and_apply(spec, env, model, mesh)
    if hf and not early:  # each rank reads only its shards
        load_hf(spec, env, parts, cfg)
    if lora:  # seeded, layout-independent: after the base is in place
        init_lora(parts, seed=spec.train.seed)
    return parts, pipeline


def frozen_model(spec: JobSpec, env, mesh, cfg: ModelConfig, folder: str | None) -> nn.Module:
    """A frozen copy of the model the job starts from (``folder``: another Hugging Face
    folder of the same vocabulary instead), in eval mode, sharded like the trained model
    under FSDP (ZeRO stage, offload), whole on each rank otherwise (DDP replicates it:
    nothing of it is reduced)."""
    torch.manual_seed(spec.train.seed)
    folder = folder or spec.model.hf
    if folder is not None and folder != spec.model.hf:
        cfg = _same_vocabulary(hf_model_config(folder, stores_of(spec)), cfg, folder)
    model = build_model(cfg, seed=spec.train.seed, device="meta" if folder else str(env.device))
    model.requires_grad_(False)
    if spec.train.precision == "bf16":  # autocast computes in bf16 anyway
        hold_frozen_linears_in(model, torch.bfloat16)
    early = folder is not None and loads_before_strategy(spec, mesh)
    if early:
        load_hf(spec, env, [model], cfg, folder)
    if mesh is not None and spec.parallelism.strategy == "fsdp":
        from workers.strategies.fsdp import shard_data_parallel

        cfg_s = StrategyConfig(parallelism=spec.parallelism, precision=spec.train.precision)
        model = shard_data_parallel(model, dp_mesh=mesh["dp"], cfg=cfg_s)
    if folder is not None and not early:
        load_hf(spec, env, [model], cfg, folder)
    return model.eval()


def _same_vocabulary(ref: ModelConfig, cfg: ModelConfig, folder: str) -> ModelConfig:
    error = reference_vocabulary_error(ref.vocab_size, cfg.vocab_size, folder)
    if error:
        raise ValueError(error)
    return ref


def build_stepper(spec: JobSpec, env, dataset, cfg: ModelConfig | None) -> tuple[Stepper, list]:
    """This rank's stepper (model parts, optimizers, objective) and LR schedulers; ``cfg``
    None: the objective places its own model (:func:`places_model`)."""
    undo_process_patches()  # an earlier DeepSpeed job's, in a process that ran one
    mesh = build_mesh(spec, world_size=env.world_size, device=env.device)
    if places_model(spec):
        parts, pipeline = place(spec, env, mesh), None
    else:
        parts, pipeline = placed_model(spec, env, mesh, cfg)
    objective = objective_for(
        spec, parts, reference=lambda f: frozen_model(spec, env, mesh, cfg, f)
    )
    optimizers = [build_optimizer(p, train=spec.train) for p in parts]
    engine = None
    if spec.parallelism.strategy == DEEPSPEED and mesh is not None:
        from workers.strategies.deepspeed import initialize

        engine = initialize(parts[0], optimizers[0], spec=spec, env=env)
        parts = [engine.engine]  # its forward runs the module with ZeRO's hooks
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
        objective=objective,
        engine=engine,
    )
    return stepper, schedulers
