"""The plan of an ``objective: diffusion`` job: a Stable Diffusion-style UNet with LoRA on
its attention, its VAE and text encoder frozen beside it on every rank.

Memory per rank, from the folder's shape (:class:`DiffusionShape`: each part's parameters
and the UNet's attention projections, read from the weights' headers):

- parameters: the frozen UNet in fp32, its linear and convolution layers in bf16 under bf16
  precision (whole on every rank: under FSDP its one unit is gathered for each forward and
  backward) and the adapters in fp32 (sharded under FSDP);
- gradients and optimizer state of the adapters alone (AdamW 8 bytes per parameter, SGD
  with momentum 4; sharded under FSDP);
- buffers: the VAE and the text encoder in fp32 on every rank;
- activations: :data:`ACT_BYTES_PER_LATENT_PIXEL` per latent pixel of each image of a
  micro-batch, measured on a Stable Diffusion 1.5-shaped UNet with rank-8 LoRA
  (``bench/diffusion_memory.py``: 394 MiB per 256-pixel image, 0.94x the 128-pixel
  figure per pixel, and 0.99x at 512 pixels: linear in the pixels), scaled by the UNet's
  first block width against SD 1.5's 320, by :data:`BF16_ACT_SHARE` under bf16 autocast
  and to :data:`CHECKPOINTED_SHARE` with gradient checkpointing (both measured the same
  way; the bf16 share on the CPU's autocast, whose op lists are close to CUDA's).

An estimate for SD 1.x / 2.x-style UNets; the job's first step measures its memory.
"""

from __future__ import annotations

from service.planner.hardware import ClusterHardware, resolve_cluster
from service.planner.layout_rules import HEADROOM, gib
from service.planner.plan import (
    Breakdown,
    ClusterView,
    DataParallel,
    PerRank,
    Plan,
    PlanLayout,
    StateBytesPerParam,
)
from service.planner.planning import cannot_tell
from workers.contract import FSDP
from workers.models.diffusers_folder import DiffusionShape
from workers.spec import JobSpec
from workers.spec.objective import DIFFUSION_LORA_TARGETS

FP32, BF16 = 4, 2
ACT_BYTES_PER_LATENT_PIXEL = 403_670  # fp32, one image, SD 1.5 width (bench/diffusion_memory.py)
SD15_WIDTH = 320
# With gradient checkpointing (bench/diffusion_memory.py --checkpointing: 101 MiB of 394).
CHECKPOINTED_SHARE = 0.26
# Under bf16 (bench/diffusion_memory.py --bf16, the CPU's autocast: 231,383 bytes per latent
# pixel at 256 px, 223,417 at 512, against fp32's 403,670 and 397,793).
BF16_ACT_SHARE = 0.57
METHOD = (
    "diffusion: the UNet, VAE and text encoder counted from the folder's weights (fp32; "
    "the UNet's linear and convolution layers bf16 under bf16); "
    "LoRA state sharded under FSDP; activations per latent pixel measured on an SD 1.5 "
    "UNet with LoRA (bench/diffusion_memory.py), scaled by width"
)
UNKNOWN_FOLDER = (
    "the service cannot read model.hf here, so the parts' sizes are unknown; plan it where "
    "the folder is visible, or submit and read the first step's measured memory"
)


def plan_diffusion(spec: JobSpec, *, cluster: dict | None, shape: DiffusionShape | None) -> Plan:
    """The plan of ``spec`` (objective diffusion) on ``cluster`` for a folder of ``shape``
    (None when the service cannot read it: the plan says so and cannot tell)."""
    hw, cluster_errors = resolve_cluster(cluster or {})
    world, res = spec.resources.min_workers, spec.resources
    sizes = _per_rank(spec, shape, world) if shape else dict.fromkeys(_KINDS, 0)
    checkpointed = int(_activations(spec, shape, checkpointed=True)) if shape else 0
    frozen = sum(frozen_parts(shape).values()) if shape else 0
    per_rank = PerRank(**sizes, buffers_bytes=frozen, total_bytes=sum(sizes.values()) + frozen)
    unknown = None if shape else UNKNOWN_FOLDER
    unknown = unknown or cannot_tell(spec, hw)
    errors, warnings = list(cluster_errors), []
    budget = hw.gpu_memory_bytes if res.gpus_per_worker else None
    if shape and budget and unknown is None:
        total = per_rank.total_bytes
        if total > budget:
            errors.append(
                f"needs {gib(total)} per GPU, the GPUs have {gib(budget)}: lower "
                "train.micro_batch_size or diffusion.resolution, or set "
                "model.activation_checkpointing full"
            )
        elif total > HEADROOM * budget:
            warnings.append(
                f"needs {gib(total)} per GPU of {gib(budget)} (> {HEADROOM:.0%}); the allocator "
                "and CUDA context need headroom: lower train.micro_batch_size"
            )
    lora = spec.model.lora
    adapters = shape.adapter_params(lora.rank, _targets(spec)) if shape and lora else None
    return Plan(
        fits=False if errors else (None if unknown else True),
        verdict="does not fit" if errors else ("unknown" if unknown else "fits"),
        unknown_reason=unknown,
        num_params=(shape.unet_params + shape.vae_params + shape.text_encoder_params)
        if shape
        else 0,
        per_rank=per_rank,
        breakdown=_breakdown(spec, shape, sizes, checkpointed, adapters, hw, world),
        layout=PlanLayout(
            strategy=spec.parallelism.strategy,
            workers=res.workers,
            dp=world,
            data_parallel=DataParallel.of(spec),
            tp=1,
            pp=1,
            grad_accum_steps=spec.grad_accum_steps(world),
        ),
        step_estimate=None,
        cluster=ClusterView.of(hw),
        candidates=[],
        warnings=warnings,
        errors=errors,
        notes=[
            "activations are estimated for Stable Diffusion 1.x/2.x-style UNets from a "
            "measured figure per latent pixel; the job's first step measures them"
        ],
        recommendation=None,
        recommended_layout=None,
        method=METHOD,
    )


_KINDS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")


def frozen_parts(shape: DiffusionShape) -> dict[str, int]:
    """Bytes of the frozen parts every rank holds whole (fp32), by name."""
    return {"vae": shape.vae_params * FP32, "text_encoder": shape.text_encoder_params * FP32}


def planned_bytes(spec: JobSpec, shape: DiffusionShape, world: int) -> dict[str, int]:
    """Per-rank bytes at ``world`` workers by kind, the frozen parts by name
    (``vae_bytes``, ``text_encoder_bytes``) and ``total_bytes``: the job page's plan."""
    sizes = _per_rank(spec, shape, world)
    frozen = {f"{name}_bytes": n for name, n in frozen_parts(shape).items()}
    return {**sizes, **frozen, "total_bytes": sum(sizes.values()) + sum(frozen.values())}


def _targets(spec: JobSpec) -> list[str]:
    return [DIFFUSION_LORA_TARGETS[t] for t in spec.model.lora.target_modules]


def _optimizer_bytes_per_param(spec: JobSpec) -> int:
    train = spec.train
    if train.optimizer == "adamw":
        return 2 * FP32
    return FP32 if train.momentum else 0


def _per_rank(spec: JobSpec, shape: DiffusionShape, world: int) -> dict[str, int]:
    adapters = shape.adapter_params(spec.model.lora.rank, _targets(spec))
    shards = world if spec.parallelism.strategy == FSDP and world > 1 else 1
    act = _activations(spec, shape, checkpointed=spec.model.activation_checkpointing != "none")
    frozen = shape.unet_params * FP32
    if spec.train.precision == "bf16":  # its linear and convolution layers held in bf16
        frozen -= shape.unet_matmul_params * (FP32 - BF16)
    return {
        "params_bytes": frozen + adapters * FP32 // shards,
        "grads_bytes": adapters * FP32 // shards,
        "optimizer_bytes": adapters * _optimizer_bytes_per_param(spec) // shards,
        "activations_bytes": int(act),
    }


def _activations(spec: JobSpec, shape: DiffusionShape, *, checkpointed: bool) -> float:
    """Activation bytes of one micro-batch (see the module docstring)."""
    side = (spec.diffusion.resolution if spec.diffusion else 512) // 8
    act = ACT_BYTES_PER_LATENT_PIXEL * side * side * spec.train.micro_batch_size
    act *= shape.unet_width / SD15_WIDTH
    if spec.train.precision == "bf16":
        act *= BF16_ACT_SHARE
    return act * CHECKPOINTED_SHARE if checkpointed else act


def _breakdown(spec, shape, sizes, checkpointed, adapters, hw: ClusterHardware, world):
    parts = frozen_parts(shape) if shape else {}
    state = sizes["params_bytes"] + sizes["grads_bytes"] + sizes["optimizer_bytes"]
    return Breakdown(
        layout=f"{spec.parallelism.strategy} dp={world}",
        worst_pp_rank=0,
        state_bytes_per_param=StateBytesPerParam(
            params=FP32, grads=FP32, optimizer=_optimizer_bytes_per_param(spec)
        ),
        state_bytes=state,
        state_offloaded_to_host=False,
        unsharded_state_bytes=state,
        activations_checkpointed_bytes=checkpointed,
        activation_checkpointing=spec.model.activation_checkpointing,
        lora_trainable_params=adapters,
        buffers=parts,
        host={},
        host_bytes=0,
        host_bytes_per_node=None,
        gpu_memory_bytes=hw.gpu_memory_bytes if spec.resources.gpus_per_worker else None,
        micro_batches_per_step=spec.grad_accum_steps(world),
    )
