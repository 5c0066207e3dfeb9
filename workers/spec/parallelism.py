"""``parallelism``: how a job's model is split across its workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from workers.contract import STRATEGIES
from workers.spec.base import MAX_WORKERS, Spec
from workers.spec.deepspeed import DeepSpeedSpec


class FsdpSpec(Spec):
    """FSDP (ZeRO-style) sharding options."""

    zero_stage: Literal[1, 2, 3] = Field(
        3,
        description="ZeRO stage: 3 shards parameters, gradients and optimizer state and "
        "frees gathered parameters after each block's forward; 2 keeps them gathered until "
        "backward. 1 runs as 2: FSDP2 has no optimizer-state-only mode, so gradients are "
        "sharded too (less memory than ZeRO-1, never more); the plan says so.",
    )
    cpu_offload: bool = Field(
        False,
        description="Keep sharded parameters, gradients and optimizer state in host memory; "
        "each block is copied to the device for its compute. Also on a single worker, "
        "where it lets a model larger than the GPU train on it (e.g. 70B LoRA on 24 GB).",
    )


class PipelineSpec(Spec):
    """Pipeline-parallel options."""

    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="Pipeline schedule."
    )
    microbatches: int = Field(
        4, ge=1, le=MAX_WORKERS, description="Microbatches per pipeline step."
    )


class ParallelismSpec(Spec):
    """How the model is split across workers."""

    strategy: Literal[STRATEGIES] = Field(  # type: ignore[valid-type]
        "ddp", description=" | ".join(STRATEGIES) + "."
    )
    dp: int | None = Field(
        None,
        ge=1,
        le=MAX_WORKERS,
        description="Data-parallel degree; default: workers / (tp x pp).",
    )
    tp: int = Field(1, ge=1, le=MAX_WORKERS, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, le=MAX_WORKERS, description="Pipeline-parallel degree.")
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec, description="FSDP options.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipeline options.")
    deepspeed: DeepSpeedSpec = Field(
        default_factory=DeepSpeedSpec, description="DeepSpeed options (strategy deepspeed)."
    )

    @model_validator(mode="after")
    def _degrees_match_strategy(self) -> ParallelismSpec:
        allowed = {
            "ddp": (False, False),
            "fsdp": (False, False),
            "tp": (True, False),
            "pp": (False, True),
            "hybrid": (True, True),
            "deepspeed": (False, False),
        }[self.strategy]
        if self.strategy != "deepspeed" and self.deepspeed != DeepSpeedSpec():
            raise ValueError(
                f"parallelism.deepspeed is read by strategy 'deepspeed' only (this job's is "
                f"{self.strategy!r}): set parallelism.strategy deepspeed or remove it"
            )
        if not allowed[0] and self.tp != 1:
            raise ValueError(
                f"parallelism.tp must be 1 for strategy {self.strategy!r}; "
                "use strategy 'tp' or 'hybrid' for tensor parallelism"
            )
        if not allowed[1] and self.pp != 1:
            raise ValueError(
                f"parallelism.pp must be 1 for strategy {self.strategy!r}; "
                "use strategy 'pp' or 'hybrid' for pipeline parallelism"
            )
        return self

    @model_validator(mode="after")
    def _microbatches_fit_schedule(self) -> ParallelismSpec:
        # torch.distributed.pipelining refuses these when the schedule is built,
        # i.e. on the workers after the job started; refuse them at submission.
        mb, pp, schedule = self.pipeline.microbatches, self.pp, self.pipeline.schedule
        if pp > 1 and schedule == "1f1b" and mb < pp:
            raise ValueError(
                f"parallelism.pipeline.microbatches ({mb}) must be >= parallelism.pp ({pp}) "
                "for schedule '1f1b'; raise microbatches or use schedule 'gpipe'"
            )
        rounds = max(1, mb // pp)
        if pp > 1 and schedule == "interleaved_1f1b" and mb % rounds:
            raise ValueError(
                f"parallelism.pipeline.microbatches ({mb}) must be at most parallelism.pp "
                f"({pp}) or a multiple of microbatches // pp ({rounds}) for schedule "
                f"'interleaved_1f1b'; use a multiple of {pp}"
            )
        return self

    @property
    def model_parallel_size(self) -> int:
        """Workers that hold one full model replica between them (tp x pp)."""
        return self.tp * self.pp
