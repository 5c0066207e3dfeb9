"""A first planner: parameter, gradient, optimizer and activation memory per rank.

This is the simple estimate the foundation needs to refuse what cannot run
(strategies this build lacks, a model that cannot fit the stated GPU); the full
layout planner replaces it. Imports no torch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from workers.models import count_params, get_model_config
from workers.spec import JobSpec

GIB = 1024**3
# Strategies whose worker code this build ships (the registry in
# workers.strategies holds the same names; a unit test keeps them equal).
AVAILABLE_STRATEGIES = ("ddp", "fsdp", "tp", "pp", "hybrid")


class ClusterSpec(BaseModel):
    """The hypothetical cluster of a dry run (POST /v1/plan ``cluster``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nodes: int | None = Field(None, ge=1, description="Nodes.")
    gpus_per_node: int | None = Field(None, ge=0, description="GPUs per node.")
    gpu: str | None = Field(None, description="GPU model, e.g. H100-80GB.")
    gpu_memory_gb: float | None = Field(None, gt=0, description="Memory of one GPU in GiB.")
    interconnect: str | None = Field(None, description="nvlink, pcie, ...")
    cpus_per_node: float | None = Field(None, gt=0, description="CPUs per node.")


def _state_shards(spec: JobSpec) -> int:
    """How many ranks share one copy of parameters, gradients and optimizer state.

    FSDP2 shards all three over dp at every zero stage (stage 1 maps to 2);
    tensor and pipeline parallelism split them over tp and pp. Embeddings and
    norms that TP replicates are ignored here: the full planner counts them.
    """
    par = spec.parallelism
    dp = spec.data_parallel_size(spec.resources.min_workers)
    # Every strategy but DDP shards over dp with FSDP2 when dp > 1.
    return (1 if par.strategy == "ddp" else dp) * par.tp * par.pp


def _layout_errors(spec: JobSpec, cluster: dict) -> list[str]:
    """A TP group must fit on one node: its consecutive ranks share a node's interconnect."""
    par, res = spec.parallelism, spec.resources
    if par.tp == 1:
        return []
    per_node, unit, what = ((cluster.get("gpus_per_node"), res.gpus_per_worker, "GPUs")
                            if res.gpus_per_worker else
                            (cluster.get("cpus_per_node"), res.cpus_per_worker, "CPUs"))
    if per_node is not None and par.tp * unit > per_node + 1e-9:
        return [f"parallelism.tp ({par.tp}) x {what.lower()} per worker ({unit:g}) = "
                f"{par.tp * unit:g} {what} would span nodes of {per_node:g} {what}; TP must "
                f"stay inside one node: reduce parallelism.tp to <= {int(per_node // unit)}"]
    return []


def _activation_bytes(spec: JobSpec) -> int:
    """Activations of one micro-batch kept for backward (Korthikanti et al., no recompute).

    Per layer about s*b*h*(34 + 5*a*s/h) bytes in 16-bit; doubled for fp32.
    """
    cfg = get_model_config(spec.model.preset)
    s, b, h, a = spec.data.seq_len, spec.train.micro_batch_size, cfg.dim, cfg.n_heads
    per_layer = s * b * h * (34 + 5 * a * s / h)
    scale = 1.0 if spec.train.precision == "bf16" else 2.0
    logits = s * b * cfg.vocab_size * 4 * 2  # fp32 logits and their gradient
    return int(per_layer * cfg.n_layers * scale + logits)


def plan_job(spec: JobSpec, *, cluster: dict | None = None) -> dict:
    """Memory per rank and a verdict for ``spec`` on ``cluster`` (optional)."""
    n = count_params(get_model_config(spec.model.preset))
    errors: list[str] = []
    warnings: list[str] = []
    if spec.parallelism.strategy not in AVAILABLE_STRATEGIES:
        errors.append(
            f"parallelism.strategy {spec.parallelism.strategy!r} is not available in this "
            f"release; use one of {list(AVAILABLE_STRATEGIES)}")
    if spec.checkpoint.async_:
        errors.append("checkpoint.async is not available in this release; set it to false")
    errors += _layout_errors(spec, cluster or {})
    opt_per_param = 8 if spec.train.optimizer == "adamw" else (4 if spec.train.momentum else 0)
    local = n // _state_shards(spec)
    per_rank = {
        "params_bytes": 4 * local,  # fp32 master weights (bf16 is autocast, not stored)
        "grads_bytes": 4 * local,
        "optimizer_bytes": opt_per_param * local,
        "activations_bytes": _activation_bytes(spec),
        "buffers_bytes": min(4 * local, 2 * 25 * 1024**2),  # DDP buckets / FSDP gathers
    }
    per_rank["total_bytes"] = sum(per_rank.values())
    fits = True
    gpu_gb = (cluster or {}).get("gpu_memory_gb")
    if gpu_gb and spec.resources.gpus_per_worker > 0:
        fits = per_rank["total_bytes"] <= gpu_gb * GIB
        if not fits:
            errors.append(
                f"needs {per_rank['total_bytes'] / GIB:.1f} GiB per rank but the GPU has "
                f"{gpu_gb} GiB; use a smaller model.preset or train.micro_batch_size")
    return {
        "fits": fits and not errors, "num_params": n, "per_rank": per_rank,
        "layout": {"strategy": spec.parallelism.strategy,
                   "workers": spec.resources.model_dump()["workers"],
                   "dp": spec.data_parallel_size(spec.resources.min_workers),
                   "tp": spec.parallelism.tp, "pp": spec.parallelism.pp,
                   "grad_accum_steps": spec.grad_accum_steps(spec.resources.min_workers)},
        "warnings": warnings, "errors": errors,
        "recommendation": "ddp" if not errors else None,
        "method": "simple estimate (parameters, gradients, optimizer, activations)",
    }
