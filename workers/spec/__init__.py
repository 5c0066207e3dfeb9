"""The job spec: one pydantic tree that is both the REST body and the worker config.

The service validates a submitted spec with :class:`JobSpec`; the job driver on
the Ray cluster re-validates the same JSON. Every cross-field check raises a
``ValueError`` that names the fields and says what would be accepted, so the
API can answer 422 with a field path and a hint.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from workers.contract import STRATEGIES
from workers.models.config import get_model_config
from workers.models.hf_config import check_layout
from workers.spec.base import MAX_STEPS, SECRET_SAFE, Spec
from workers.spec.checkpoint import CheckpointSpec
from workers.spec.data import DataSource, DataSpec, EvalDataSpec
from workers.spec.deepspeed import DeepSpeedSpec, config_disagreements
from workers.spec.metrics import MetricsSpec
from workers.spec.model import MODEL_PRESETS, LoraSpec, ModelSpec, lora_layout_error
from workers.spec.objective import OBJECTIVES, DiffusionSpec, DpoSpec, objective_error
from workers.spec.parallelism import FsdpSpec, ParallelismSpec, PipelineSpec
from workers.spec.resources import ResourcesSpec, WorkerRange
from workers.spec.stores import (
    GcsSpec,
    S3Spec,
    StoresSpec,
    move_legacy_stores,
    spec_paths,
    unused_store_error,
)

__all__ = [
    "MODEL_PRESETS",
    "OBJECTIVES",
    "STRATEGIES",
    "CheckpointSpec",
    "DataSource",
    "DataSpec",
    "DeepSpeedSpec",
    "DpoSpec",
    "EarlyStoppingSpec",
    "EvalDataSpec",
    "FailureSpec",
    "FsdpSpec",
    "GcsSpec",
    "JobSpec",
    "LoraSpec",
    "MetricsSpec",
    "ModelSpec",
    "ParallelismSpec",
    "PipelineSpec",
    "ResourcesSpec",
    "S3Spec",
    "Spec",
    "StoresSpec",
    "TrainSpec",
    "WorkerRange",
    "parse_spec",
]

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class EarlyStoppingSpec(Spec):
    """When a job stops because its held-out loss stopped improving."""

    patience: int = Field(
        ge=1,
        le=MAX_STEPS,
        description="Evaluations in a row without an improvement after which the job stops.",
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="An evaluation improves when its eval_loss is below the best so far by "
        "more than this.",
    )


class TrainSpec(Spec):
    """The optimisation itself."""

    steps: int = Field(50, ge=1, le=MAX_STEPS, description="Optimizer steps to run.")
    global_batch_size: int = Field(
        16,
        ge=1,
        le=2**24,
        description="Samples per optimizer step; invariant under elastic resizes.",
    )
    micro_batch_size: int = Field(
        4, ge=1, le=2**16, description="Samples per forward/backward on a worker."
    )
    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate.")
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="Linear warmup steps before cosine decay."
    )
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Cosine decay floor as a fraction of lr."
    )
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="adamw | sgd.")
    weight_decay: float = Field(
        0.0, ge=0, le=10, description="Decoupled (AdamW) or L2 (SGD) decay."
    )
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum.")
    grad_clip: float = Field(0.0, ge=0, le=1e6, description="Clip the global grad norm; 0 = off.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="fp32 | bf16 autocast.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for init, data order and dropout.")
    eval_every_steps: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Evaluate the held-out set (data.eval or data.eval_fraction) after every "
        "this many steps and after the last one: every rank runs the forward of its share "
        "without gradients, in eval mode; the loss is the mean over the whole set's counted "
        "tokens, the same for any world size and layout. Reported as eval_loss and "
        "eval_perplexity; its time is goodput's eval_s, not training time. Unset with an "
        "evaluation set: only after the last step.",
    )
    eval_samples: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="Evaluate only the first this many samples of the evaluation set (in its "
        "fixed order); unset = all of it.",
    )
    early_stopping: EarlyStoppingSpec | None = Field(
        None,
        description="End the job (SUCCEEDED, with an early_stopped event naming the step, "
        "and a checkpoint of that step) once the held-out loss has not improved for "
        "patience evaluations in a row; needs train.eval_every_steps.",
    )

    @model_validator(mode="after")
    def _batch_and_warmup(self) -> TrainSpec:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"train.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({self.micro_batch_size})"
            )
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"train.warmup_steps ({self.warmup_steps}) must be < train.steps ({self.steps})"
            )
        return self


class FailureSpec(Spec):
    """How failures are retried."""

    max_failures: int = Field(
        3, ge=-1, le=10_000, description="Worker-group restarts inside one Ray job; -1 = unlimited."
    )
    max_resubmits: int = Field(
        2,
        ge=0,
        le=1000,
        description="Times the service resubmits the whole Ray job when its driver "
        "or cluster dies (resuming from the newest checkpoint).",
    )
    warm_spares: bool = Field(
        True,
        description="Keep, on each node, one idle worker process per training worker "
        "with torch and the training code already imported, so that a worker group restarted "
        "after a failure or a resize starts in about a second instead of 5-15 s. Costs each "
        "node about 0.4 GB of host memory per worker; no GPU memory.",
    )


class JobSpec(Spec):
    """A training job: model, data, layout, resources, optimisation, checkpoints, failures."""

    # Inputs stay out of ValidationError's text (the API omits them too): a mistyped
    # checkpoint.storage or stores.s3 value may hold a key.
    model_config = SECRET_SAFE

    name: str = Field(description="DNS-label-like job name, <= 47 characters.")
    objective: Literal[tuple(OBJECTIVES)] = Field(  # type: ignore[valid-type]
        "causal_lm",
        description="What the model is trained to do: "
        + "; ".join(f"{name}: {o.summary}" for name, o in OBJECTIVES.items())
        + ".",
    )
    dpo: DpoSpec | None = Field(
        None, description="Options of objective dpo (defaults when it is unset)."
    )
    diffusion: DiffusionSpec | None = Field(
        None, description="Options of objective diffusion (defaults when it is unset)."
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model.")
    data: DataSpec = Field(default_factory=DataSpec, description="Training data.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallel layout."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Resources.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Optimisation.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="Checkpoint policy."
    )
    failure: FailureSpec = Field(default_factory=FailureSpec, description="Failure handling.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Training curves.")
    stores: StoresSpec = Field(
        default_factory=StoresSpec,
        description="How the s3:// and gs:// paths (model.hf, model.tokenizer, data.path, "
        "data.eval.path, checkpoint.storage) are reached: each path's scheme selects "
        "stores.s3 or stores.gcs.",
    )

    @model_validator(mode="before")
    @classmethod
    def _stores_moved_out_of_checkpoint(cls, data):
        # Specs written before the stores section carried checkpoint.s3 / checkpoint.gcs.
        return move_legacy_stores(data)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if len(v) > 47 or not NAME_RE.fullmatch(v):
            raise ValueError(
                "name must be 1-47 lowercase letters, digits or '-', starting and ending "
                f"with a letter or digit (got {v!r})"
            )
        return v

    @model_validator(mode="after")
    def _stores_are_used(self) -> JobSpec:
        error = unused_store_error(self.stores, spec_paths(self))
        if error:
            raise ValueError(error)
        return self

    @model_validator(mode="after")
    def _objective_fits(self) -> JobSpec:
        error = objective_error(self)
        if error:
            raise ValueError(error)
        return self

    @model_validator(mode="after")
    def _eval_has_a_set(self) -> JobSpec:
        if not self.data.has_eval_set():
            for name in ("eval_every_steps", "eval_samples", "early_stopping"):
                if getattr(self.train, name) is not None:
                    raise ValueError(
                        f"train.{name} needs an evaluation set: add data.eval (a source) or "
                        "data.eval_fraction (held-out training samples; with data.sources, a "
                        f"source's eval_fraction), or remove train.{name}"
                    )
        return self

    @model_validator(mode="after")
    def _packing_fits_layout(self) -> JobSpec:
        if self.data.packing and self.parallelism.pp > 1:
            raise ValueError(
                "data.packing is not available with pipeline parallelism (parallelism.pp > 1): "
                "its stages do not carry the samples' positions; use dp, fsdp, tp or hybrid "
                "without pp, or remove data.packing"
            )
        return self

    @model_validator(mode="after")
    def _ranked_by_evaluations(self) -> JobSpec:
        every, ck = self.train.eval_every_steps, self.checkpoint
        for name, value in (
            ("train.early_stopping", self.train.early_stopping),
            ("checkpoint.keep_best", ck.keep_best),
        ):
            if value is not None and every is None:
                raise ValueError(
                    f"{name} needs train.eval_every_steps (how often the held-out loss is "
                    "measured) and an evaluation set (data.eval or data.eval_fraction)"
                )
        fixed = ck.interval is None and ck.every_seconds is None and ck.every_steps
        if ck.keep_best is not None and fixed and ck.every_steps % every:
            raise ValueError(
                f"checkpoint.keep_best ranks saves by their eval_loss: checkpoint.every_steps "
                f"({ck.every_steps}) must be a multiple of train.eval_every_steps ({every}); "
                f"use {every * max(1, ck.every_steps // every)}"
            )
        return self

    @model_validator(mode="after")
    def _layout_fits_workers(self) -> JobSpec:
        par, res = self.parallelism, self.resources
        mp = par.model_parallel_size
        for n in sorted({res.min_workers, res.max_workers}):
            if n % mp:
                raise ValueError(
                    f"resources.workers ({n}) must be a multiple of parallelism.tp x "
                    f"parallelism.pp ({mp})"
                )
        if par.dp is not None and (not isinstance(res.workers, int) or par.dp * mp != res.workers):
            raise ValueError(
                f"parallelism.dp ({par.dp}) x tp ({par.tp}) x pp ({par.pp}) must equal "
                f"resources.workers ({res.workers}); omit parallelism.dp to derive it"
            )
        for n in range(res.min_workers, res.max_workers + 1):
            if n % mp == 0:
                self._check_batch_for(dp=n // mp)
        return self

    @model_validator(mode="after")
    def _deepspeed_config_agrees(self) -> JobSpec:
        config = self.parallelism.deepspeed.config
        if self.parallelism.strategy == "deepspeed" and config:
            res = self.resources
            error = config_disagreements(
                config,
                train=self.train,
                workers=(res.min_workers, res.max_workers),
                dp_of=self.data_parallel_size,
            )
            if error:
                raise ValueError(error)
        return self

    def _check_batch_for(self, *, dp: int) -> None:
        t, par = self.train, self.parallelism
        if par.pp > 1:
            unit = t.micro_batch_size * dp * par.pipeline.microbatches
            if t.global_batch_size % unit:
                raise ValueError(
                    f"train.global_batch_size ({t.global_batch_size}) must be a multiple of "
                    f"train.micro_batch_size ({t.micro_batch_size}) x data-parallel size ({dp}) "
                    f"x parallelism.pipeline.microbatches ({par.pipeline.microbatches}); use a "
                    f"global_batch_size that is a multiple of {unit}"
                )
            return
        if t.global_batch_size % (t.micro_batch_size * dp):
            raise ValueError(
                f"train.global_batch_size ({t.global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({t.micro_batch_size}) x data-parallel size ({dp}); "
                f"use a global_batch_size that is a multiple of {t.micro_batch_size * dp}"
            )

    @model_validator(mode="after")
    def _layout_fits_model(self) -> JobSpec:
        if self.model.hf is not None:
            # The shape is in the folder's config.json: the service checks it at submit
            # (workers.models.hf_config.check_layout) and the workers again when they build.
            return self
        par = self.parallelism
        stages = par.pp * (2 if par.pipeline.schedule == "interleaved_1f1b" else 1)
        # The same rules the service applies to a model.hf folder's config.json at submit.
        check_layout(
            get_model_config(self.model.preset),
            tp=par.tp,
            stages=stages if par.pp > 1 else 1,
            seq_len=self.data.seq_len,
            where=f"model.preset {self.model.preset!r}",
        )
        return self

    @model_validator(mode="after")
    def _lora_fits_layout(self) -> JobSpec:
        if self.model.lora is not None:
            error = lora_layout_error(
                self.model.lora,
                tp=self.parallelism.tp,
                gpus_per_worker=self.resources.gpus_per_worker,
            )
            if error:
                raise ValueError(error)
        return self

    def model_folders(self) -> dict[tuple, str | None]:
        """The model folders the job reads, by field: model.hf, model.tokenizer and a
        dpo.reference folder (None where unset)."""
        reference = self.dpo.reference_folder if self.dpo is not None else None
        return {
            ("model", "hf"): self.model.hf,
            ("model", "tokenizer"): self.model.tokenizer,
            **({("dpo", "reference"): reference} if reference else {}),
        }

    def data_parallel_size(self, world_size: int) -> int:
        """Data-parallel degree at a given world size."""
        return world_size // self.parallelism.model_parallel_size

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches each data-parallel rank runs per optimizer step."""
        dp = self.data_parallel_size(world_size)
        return self.train.global_batch_size // (self.train.micro_batch_size * dp)


def parse_spec(data: dict) -> JobSpec:
    """Validate a plain mapping (from JSON or YAML) into a :class:`JobSpec`."""
    return JobSpec.model_validate(data)
