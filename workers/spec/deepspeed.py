"""``parallelism.deepspeed``: the DeepSpeed ZeRO engine's options, and a user's
``deepspeed_config.json`` read into them.

etrain builds the engine's configuration itself (:func:`engine_config`), from the spec
and the world size: the micro-batch and accumulation steps follow the global batch at
every size (an elastic resize keeps it), the optimizer is ``train``'s, and precision,
clipping and the LR schedule are the spec's. A user's configuration file
(``parallelism.deepspeed.config``) is read into the same fields: its ZeRO options set
those of ``parallelism.deepspeed`` that the spec leaves unset, and every key that
restates the spec (batch sizes, optimizer, precision, clipping) must agree with it. A
disagreement, or a key etrain does not run (monitors that write files, a swap folder of
its own, a scheduler of its own), is refused naming both fields: nothing is overridden
quietly. NVMe offload swaps to a folder the service chooses (:mod:`workers.storage.nvme`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from workers.spec.base import Spec

# DeepSpeed accepts "auto" (Hugging Face's and Accelerate's configs are full of it) for
# what the launcher decides: here that is etrain, from the spec.
AUTO = "auto"
# The ZeRO options a spec may set; None leaves DeepSpeed's default (the planner reads
# those defaults from DEEPSPEED_DEFAULTS).
TUNING = (
    "overlap_comm",
    "contiguous_gradients",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
)
# DeepSpeed 0.19.8's defaults for the tuning options (deepspeed.runtime.zero.config);
# tests/unit check them against the installed DeepSpeed.
DEEPSPEED_DEFAULTS = {
    "contiguous_gradients": True,
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}
# Top-level keys of a deepspeed_config.json that are accepted and ignored: logging
# intervals (etrain's metrics stand) and the two ZeRO optimizer switches engine_config
# always sets itself (etrain's torch optimizer is the one that runs).
_IGNORED = {
    "steps_per_print",
    "wall_clock_breakdown",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
}
_ELSEWHERE = {
    "tensorboard": "metrics.tensorboard",
    "wandb": "metrics.wandb",
    "comet": "metrics.mlflow or metrics.wandb",
    "csv_monitor": "metrics (etrain records every step's metrics itself)",
    "flops_profiler": "the job's metrics (tokens_per_s, MFU on the job page)",
    "checkpoint": "checkpoint (etrain saves and restores DeepSpeed jobs itself)",
    "scheduler": "train.lr, train.warmup_steps and train.min_lr_ratio (etrain's warmup and "
    "cosine schedule)",
    "fp16": "train.precision (fp32 or bf16; fp16 with loss scaling is not offered)",
    "amp": "train.precision",
    "activation_checkpointing": "model.activation_checkpointing",
}
_ZERO_KEYS = {"stage", "offload_optimizer", "offload_param", *TUNING}
# Optimizer parameters in a config, and the train field (or the value etrain uses) each
# must agree with.
_OPTIMIZER_TYPES = {"adamw": "adamw", "adam": "adamw", "sgd": "sgd"}
_FIXED_OPTIMIZER = {"betas": (0.9, 0.999), "eps": 1e-8}


class DeepSpeedSpec(Spec):
    """DeepSpeed ZeRO options (``parallelism.strategy: deepspeed``)."""

    zero_stage: Literal[0, 1, 2, 3] = Field(
        2,
        description="ZeRO stage: 0 replicates everything (DeepSpeed's data parallelism), 1 "
        "shards the optimizer state, 2 also the gradients, 3 also the parameters.",
    )
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field(
        "none",
        description="cpu: keep the optimizer state (and its step) in host memory "
        "(ZeRO-Offload; stages 1-3); nvme: swap it to the node's NVMe offload folder "
        "(stage 3; only where the operator enabled one).",
    )
    offload_param: Literal["none", "cpu", "nvme"] = Field(
        "none",
        description="cpu: keep the parameters in host memory (ZeRO-Infinity; stage 3); nvme: "
        "swap them to the node's NVMe offload folder (only where the operator enabled one).",
    )
    overlap_comm: bool | None = Field(
        None,
        description="Overlap gradient reduction with backward (DeepSpeed's default: on at "
        "stage 3, off below).",
    )
    contiguous_gradients: bool | None = Field(
        None, description="Copy gradients into one contiguous buffer as they are reduced."
    )
    reduce_bucket_size: int | None = Field(
        None, ge=1, le=10**12, description="Elements reduced at a time (DeepSpeed: 5e8)."
    )
    allgather_bucket_size: int | None = Field(
        None, ge=1, le=10**12, description="Elements gathered at a time, stages 1-2 (5e8)."
    )
    stage3_prefetch_bucket_size: int | None = Field(
        None, ge=0, le=10**12, description="Stage 3: parameter elements prefetched (5e7)."
    )
    stage3_param_persistence_threshold: int | None = Field(
        None,
        ge=0,
        le=10**12,
        description="Stage 3: parameters smaller than this stay whole on every rank (1e5).",
    )
    stage3_max_live_parameters: int | None = Field(
        None, ge=0, le=10**13, description="Stage 3: gathered elements kept at most (1e9)."
    )
    stage3_max_reuse_distance: int | None = Field(
        None, ge=0, le=10**13, description="Stage 3: keep a parameter this close to reuse (1e9)."
    )
    config: dict[str, Any] | None = Field(
        None,
        description="A deepspeed_config.json's content. Its ZeRO options fill the fields "
        "above that the spec leaves unset; its batch sizes, optimizer, precision and "
        'clipping must agree with train ("auto" always does). A key that disagrees, or '
        "one etrain does not run (scheduler, fp16, monitors, an nvme_path of its own), is refused "
        "naming the train or parallelism field that decides it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_config(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            return data
        data = dict(data)
        for field, value in _zero_options(data["config"]).items():
            given = data.get(field)
            if given is not None and given != value:
                raise ValueError(
                    f"parallelism.deepspeed.{field} ({given}) disagrees with "
                    f"parallelism.deepspeed.config.zero_optimization ({value}): remove one"
                )
            data[field] = value
        return data

    @model_validator(mode="after")
    def _offload_fits_stage(self) -> DeepSpeedSpec:
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError(
                "parallelism.deepspeed.offload_optimizer needs zero_stage 1, 2 or 3 (stage 0 "
                "keeps no sharded optimizer to offload)"
            )
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError(
                "parallelism.deepspeed.offload_param needs zero_stage 3 (only stage 3 "
                "partitions the parameters)"
            )
        if self.uses_nvme and self.zero_stage != 3:
            raise ValueError(
                "parallelism.deepspeed offload to nvme needs zero_stage 3 (DeepSpeed swaps to "
                "NVMe at stage 3 only); use offload_optimizer cpu below it"
            )
        if self.overlap_comm and self.zero_stage < 2:
            raise ValueError(
                "parallelism.deepspeed.overlap_comm needs zero_stage 2 or 3 (below, gradients "
                "are reduced once per step, after backward)"
            )
        return self

    @property
    def uses_nvme(self) -> bool:
        """Whether the job swaps optimizer state or parameters to NVMe."""
        return "nvme" in (self.offload_optimizer, self.offload_param)

    def zero_config(self, nvme: dict | None = None) -> dict:
        """The engine's ``zero_optimization`` section; ``nvme``: the swap folder and buffer
        size (``nvme_path``, ``buffer_size``) the worker chose, for an nvme offload."""
        out: dict[str, Any] = {"stage": self.zero_stage}
        for name in ("offload_optimizer", "offload_param"):
            device = getattr(self, name)
            if device == "nvme" and not nvme:
                raise ValueError(f"parallelism.deepspeed.{name} nvme needs a swap folder")
            if device == "cpu":
                out[name] = {"device": "cpu"}
            elif device == "nvme":
                keep = ("nvme_path", "buffer_size") if name == "offload_param" else ("nvme_path",)
                out[name] = {"device": "nvme", **{k: nvme[k] for k in keep}}
        out.update({k: getattr(self, k) for k in TUNING if getattr(self, k) is not None})
        return out


def _zero_options(config: dict) -> dict[str, Any]:
    """The ZeRO fields a config's ``zero_optimization`` sets (auto values left out)."""
    zero = config.get("zero_optimization")
    if zero is None:
        return {}
    if not isinstance(zero, dict):
        raise ValueError("parallelism.deepspeed.config.zero_optimization must be an object")
    unknown = sorted(set(zero) - _ZERO_KEYS)
    if unknown:
        raise ValueError(
            f"parallelism.deepspeed.config.zero_optimization.{unknown[0]} is not run by etrain; "
            f"it accepts {', '.join(sorted(_ZERO_KEYS))}: remove it"
        )
    out = {}
    for key, value in zero.items():
        if value == AUTO:
            continue
        if key in ("offload_optimizer", "offload_param"):
            value = _offload_device(key, value)
        out["zero_stage" if key == "stage" else key] = value
    return out


def _offload_device(key: str, value: Any) -> str:
    device = value.get("device", "none") if isinstance(value, dict) else value
    path = value.get("nvme_path", AUTO) if isinstance(value, dict) else AUTO
    where = f"parallelism.deepspeed.config.zero_optimization.{key}"
    if path not in (AUTO, None):
        raise ValueError(
            f"{where}.nvme_path is the service's: a job swaps to a folder of its own under the "
            "operator's NVMe offload root (ETRAIN_POLICY_NVME_ROOT); remove nvme_path"
        )
    if device not in ("none", "cpu", "nvme"):
        raise ValueError(f"{where}.device must be none, cpu or nvme")
    return device


def config_disagreements(config: dict, *, train, workers: tuple[int, int], dp_of) -> str | None:
    """Why a deepspeed_config.json cannot run as the spec says (None when it can): the first
    key that restates a ``train`` field with another value, or that etrain does not run.
    ``workers``: (min, max) workers; ``dp_of``: data-parallel size at a world size."""
    for key in sorted(config):
        if key in _IGNORED or key == "zero_optimization":
            continue
        where = f"parallelism.deepspeed.config.{key}"
        if key in _ELSEWHERE and not (key in ("fp16", "amp") and not _enabled(config[key])):
            return f"{where} is not run by etrain: {_ELSEWHERE[key]} decides it; remove it"
        check = _CHECKS.get(key)
        if check is None:
            return (
                f"{where} is not run by etrain; a config may set zero_optimization, the batch "
                f"sizes, optimizer, bf16 and gradient_clipping (agreeing with train): remove it"
            )
        error = check(config[key], where, train, workers, dp_of)
        if error:
            return error
    return None


def _enabled(section: Any) -> bool:
    return section == AUTO or (isinstance(section, dict) and section.get("enabled", False))


def _same(given: Any, want: Any, where: str, field: str) -> str | None:
    if given == AUTO:
        return None
    close = (
        isinstance(given, int | float)
        and not isinstance(given, bool)
        and math.isclose(given, want, rel_tol=1e-9, abs_tol=0.0)
    )
    if close or given == want:
        return None
    return (
        f"{where} ({given!r}) disagrees with {field} ({want!r}): make them equal or remove {where}"
    )


def _batch(given, where, train, workers, dp_of) -> str | None:
    return _same(given, train.global_batch_size, where, "train.global_batch_size")


def _micro(given, where, train, workers, dp_of) -> str | None:
    return _same(given, train.micro_batch_size, where, "train.micro_batch_size")


def _accumulation(given, where, train, workers, dp_of) -> str | None:
    if given == AUTO:
        return None
    steps = {train.global_batch_size // (train.micro_batch_size * dp_of(n)) for n in workers}
    if len(steps) > 1:
        return (
            f"{where} is derived by etrain at each world size of an elastic job "
            "(train.global_batch_size / (train.micro_batch_size x workers)): remove it"
        )
    derived = "train.global_batch_size / (train.micro_batch_size x workers)"
    return _same(given, steps.pop(), where, derived)


def _clipping(given, where, train, workers, dp_of) -> str | None:
    return _same(given, train.grad_clip, where, "train.grad_clip")


def _bf16(given, where, train, workers, dp_of) -> str | None:
    if given == AUTO:
        return None
    on = isinstance(given, dict) and given.get("enabled", False)
    if on == AUTO or on == (train.precision == "bf16"):
        return None
    return (
        f"{where}.enabled ({on}) disagrees with train.precision ({train.precision!r}): make "
        f"them agree or remove {where}"
    )


def _optimizer(given, where, train, workers, dp_of) -> str | None:
    if given == AUTO:
        return None
    if not isinstance(given, dict):
        return f"{where} must be an object with type and params"
    kind = given.get("type", AUTO)
    if kind != AUTO and _OPTIMIZER_TYPES.get(str(kind).lower()) != train.optimizer:
        return (
            f"{where}.type ({kind!r}) disagrees with train.optimizer ({train.optimizer!r}): "
            f"make them agree or remove {where}"
        )
    params = given.get("params") or {}
    if not isinstance(params, dict):
        return f"{where}.params must be an object"
    fields = {"lr": train.lr, "weight_decay": train.weight_decay}
    fields |= {"momentum": train.momentum} if train.optimizer == "sgd" else {}
    for name, value in params.items():
        if name in ("torch_adam", "adam_w_mode"):  # how, not what: etrain uses torch's
            continue
        if name in fields:
            error = _same(value, fields[name], f"{where}.params.{name}", f"train.{name}")
        elif name in _FIXED_OPTIMIZER and train.optimizer == "adamw":
            want = _FIXED_OPTIMIZER[name]
            given_v = tuple(value) if isinstance(value, list) else value
            error = _same(given_v, want, f"{where}.params.{name}", f"etrain's AdamW {name}")
        else:
            return (
                f"{where}.params.{name} is not run by etrain (train sets the optimizer): remove it"
            )
        if error:
            return error
    return None


_CHECKS = {
    "train_batch_size": _batch,
    "train_micro_batch_size_per_gpu": _micro,
    "gradient_accumulation_steps": _accumulation,
    "gradient_clipping": _clipping,
    "bf16": _bf16,
    "bfloat16": _bf16,
    "optimizer": _optimizer,
    "fp16": lambda *a: None,  # disabled (enabled is refused above)
    "amp": lambda *a: None,
}


def engine_config(
    deepspeed: DeepSpeedSpec, *, train, accumulation: int, nvme: dict | None = None
) -> dict:
    """The configuration ``deepspeed.initialize`` is given on a rank, from the spec alone.

    The engine runs in fp32: train.precision bf16 is autocast over fp32 weights, as under
    every etrain strategy (DeepSpeed's own bf16 mode would keep bf16 weights, and a job
    could not continue under another strategy with the same numbers). The optimizer is
    etrain's (a torch optimizer), so ZeRO is told to take it as it is. ``nvme``: see
    :meth:`DeepSpeedSpec.zero_config`.
    """
    return {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": train.grad_clip,  # always: DeepSpeed's default is 1.0, not off
        "zero_optimization": deepspeed.zero_config(nvme),
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }


__all__ = [
    "DEEPSPEED_DEFAULTS",
    "DeepSpeedSpec",
    "config_disagreements",
    "engine_config",
]
