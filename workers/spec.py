"""The job spec: one pydantic tree that is both the REST body and the worker config.

The service validates a submitted spec with :class:`JobSpec`; the job driver on
the Ray cluster re-validates the same JSON. Every cross-field check raises a
``ValueError`` that names the fields and says what would be accepted, so the
API can answer 422 with a field path and a hint.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from workers.models.config import get_model_config
from workers.storage_spec import GcsSpec, S3Spec, check_storage_uri

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MODEL_PRESETS = ("gpt-tiny", "gpt-small", "llama-1b", "llama-7b", "llama-70b")
STRATEGIES = ("ddp", "fsdp", "tp", "pp", "hybrid")


class _Spec(BaseModel):
    """Base for every spec section: unknown fields are an error, not a silent no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              allow_inf_nan=False)


class ModelSpec(_Spec):
    """Which model to train."""

    preset: Literal[MODEL_PRESETS] = Field(  # type: ignore[valid-type]
        "gpt-tiny",
        description="Built-in Llama-style decoder preset: gpt-tiny (CPU tests), "
        "gpt-small, llama-1b, llama-7b, llama-70b.",
    )


class DataSpec(_Spec):
    """Where training samples come from."""

    source: Literal["synthetic", "text", "jsonl"] = Field(
        "synthetic",
        description="synthetic (seeded random tokens), text (a UTF-8 file, byte-level "
        "tokens) or jsonl (one JSON object per line with a 'text' field).",
    )
    path: str | None = Field(
        None, description="File to read for source text or jsonl; must exist on every worker."
    )
    seq_len: int = Field(128, ge=8, le=131072, description="Tokens per sample.")
    num_samples: int = Field(
        4096, ge=1, description="Samples per epoch for source synthetic (ignored otherwise)."
    )

    @model_validator(mode="after")
    def _path_matches_source(self) -> "DataSpec":
        if self.source in ("text", "jsonl") and not self.path:
            raise ValueError(f"data.path is required when data.source is {self.source!r}")
        if self.source == "synthetic" and self.path:
            raise ValueError("data.path is only used with data.source 'text' or 'jsonl'; remove it")
        return self


class FsdpSpec(_Spec):
    """FSDP (ZeRO-style) sharding options."""

    zero_stage: Literal[1, 2, 3] = Field(3, description="ZeRO stage: 1, 2 or 3.")
    cpu_offload: bool = Field(False, description="Offload sharded parameters to host memory.")


class PipelineSpec(_Spec):
    """Pipeline-parallel options."""

    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="Pipeline schedule."
    )
    microbatches: int = Field(4, ge=1, description="Microbatches per pipeline step.")


class ParallelismSpec(_Spec):
    """How the model is split across workers."""

    strategy: Literal[STRATEGIES] = Field(  # type: ignore[valid-type]
        "ddp", description="ddp | fsdp | tp | pp | hybrid."
    )
    dp: int | None = Field(
        None, ge=1, description="Data-parallel degree; default: workers / (tp x pp)."
    )
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel degree.")
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec, description="FSDP options.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipeline options.")

    @model_validator(mode="after")
    def _degrees_match_strategy(self) -> "ParallelismSpec":
        allowed = {"ddp": (False, False), "fsdp": (False, False), "tp": (True, False),
                   "pp": (False, True), "hybrid": (True, True)}[self.strategy]
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
    def _microbatches_fit_schedule(self) -> "ParallelismSpec":
        # torch.distributed.pipelining refuses these when the schedule is built,
        # i.e. on the workers after the job started; refuse them at submission.
        mb, pp, schedule = self.pipeline.microbatches, self.pp, self.pipeline.schedule
        if pp > 1 and schedule == "1f1b" and mb < pp:
            raise ValueError(
                f"parallelism.pipeline.microbatches ({mb}) must be >= parallelism.pp ({pp}) "
                "for schedule '1f1b'; raise microbatches or use schedule 'gpipe'")
        rounds = max(1, mb // pp)
        if pp > 1 and schedule == "interleaved_1f1b" and mb % rounds:
            raise ValueError(
                f"parallelism.pipeline.microbatches ({mb}) must be at most parallelism.pp "
                f"({pp}) or a multiple of microbatches // pp ({rounds}) for schedule "
                f"'interleaved_1f1b'; use a multiple of {pp}")
        return self

    @property
    def model_parallel_size(self) -> int:
        """Workers that hold one full model replica between them (tp x pp)."""
        return self.tp * self.pp


class WorkerRange(_Spec):
    """An elastic worker range: the job uses what the cluster offers between min and max."""

    min: int = Field(ge=1, description="Fewest workers the job runs with.")
    max: int = Field(ge=1, description="Most workers the job uses.")

    @model_validator(mode="after")
    def _ordered(self) -> "WorkerRange":
        if self.min > self.max:
            raise ValueError(
                f"resources.workers.min ({self.min}) must be <= resources.workers.max ({self.max})"
            )
        return self


# Tagged so a bad range reports one error at resources.workers.range, not an extra
# "should be a valid integer" and a loc holding pydantic's validator name.
Workers = Annotated[
    Union[Annotated[int, Tag("count")], Annotated[WorkerRange, Tag("range")]],
    Discriminator(lambda v: "range" if isinstance(v, (dict, WorkerRange)) else "count"),
]


class ResourcesSpec(_Spec):
    """What each worker asks of the cluster."""

    workers: Workers = Field(
        2, description="Fixed worker count, or {min, max} for an elastic job."
    )
    gpus_per_worker: int = Field(0, ge=0, le=16, description="GPUs per worker; 0 = CPU (gloo).")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs per worker; may be fractional.")

    @field_validator("workers")
    @classmethod
    def _positive(cls, v: Union[int, WorkerRange]) -> Union[int, WorkerRange]:
        if isinstance(v, int) and v < 1:
            raise ValueError("resources.workers must be >= 1, or {min, max} with min >= 1")
        return v

    @property
    def min_workers(self) -> int:
        """Fewest workers the job may run with."""
        return self.workers if isinstance(self.workers, int) else self.workers.min

    @property
    def max_workers(self) -> int:
        """Most workers the job may use."""
        return self.workers if isinstance(self.workers, int) else self.workers.max


class TrainSpec(_Spec):
    """The optimisation itself."""

    steps: int = Field(50, ge=1, description="Optimizer steps to run.")
    global_batch_size: int = Field(
        16, ge=1, description="Samples per optimizer step; invariant under elastic resizes."
    )
    micro_batch_size: int = Field(4, ge=1, description="Samples per forward/backward on a worker.")
    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps before cosine decay.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Cosine decay floor as a fraction of lr."
    )
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="adamw | sgd.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled (AdamW) or L2 (SGD) decay.")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum.")
    grad_clip: float = Field(0.0, ge=0, description="Clip the global grad norm; 0 = off.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="fp32 | bf16 autocast.")
    seed: int = Field(0, ge=0, description="Seed for init, data order and dropout.")

    @model_validator(mode="after")
    def _batch_and_warmup(self) -> "TrainSpec":
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


class CheckpointSpec(_Spec):
    """When and where checkpoints are written, and which ones are kept."""

    # storage may carry user:key@ by mistake: keep inputs out of ValidationError's text
    # (JobSpec does the same for the whole tree).
    model_config = ConfigDict(**_Spec.model_config, hide_input_in_errors=True)

    storage: str | None = Field(
        None,
        description="file:///abs/path (default: the service's data dir), s3://bucket[/prefix] "
        "(AWS S3 or, with checkpoint.s3.endpoint_url, MinIO or any S3-compatible store) or "
        "gs://bucket[/prefix] (Google Cloud Storage or, with checkpoint.gcs.endpoint_url, an "
        "emulator). Object stores are checked for write access at submit.",
    )
    s3: S3Spec | None = Field(
        None, description="Endpoint, region and credentials secret name for s3:// storage.")
    gcs: GcsSpec | None = Field(
        None, description="Endpoint for gs:// storage that is not storage.googleapis.com.")
    every_steps: int | None = Field(
        10, ge=1, description="Save every N optimizer steps; with interval 'auto', the "
        "starting interval until a save and the step time have been measured.")
    every_seconds: float | None = Field(
        None, gt=0, description="Save when this many seconds passed since the last save.")
    interval: Literal["auto"] | None = Field(
        None, description="'auto': choose the interval from the measured blocking cost of a "
        "save and the failure rate (Young/Daly), starting from every_steps; unset = "
        "every_steps / every_seconds as given.")
    mtbf_prior_s: float = Field(
        86400.0, gt=0, description="Prior mean time between failures, in seconds, for "
        "interval 'auto' before failures have been observed (ignored otherwise).")
    async_: bool = Field(
        False, alias="async", description="Write shards in the background (DCP async_save)."
    )
    keep_last: int = Field(3, ge=1, description="Newest committed checkpoints to keep.")
    keep_every: int | None = Field(
        None, ge=1, description="Also keep every checkpoint whose step is a multiple of N "
        "(e.g. 1000 keeps steps 1000, 2000, ...), on top of keep_last; unset = none.")

    @field_validator("storage")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        return None if v is None else check_storage_uri(v)

    @model_validator(mode="after")
    def _store_options_match_the_scheme(self) -> "CheckpointSpec":
        if self.s3 is not None and not (self.storage or "").startswith("s3://"):
            raise ValueError("checkpoint.s3 is only used with an s3:// checkpoint.storage; "
                             "remove it or set checkpoint.storage to s3://bucket[/prefix]")
        if self.gcs is not None and not (self.storage or "").startswith("gs://"):
            raise ValueError("checkpoint.gcs is only used with a gs:// checkpoint.storage; "
                             "remove it or set checkpoint.storage to gs://bucket[/prefix]")
        return self

    @model_validator(mode="after")
    def _interval_fields_agree(self) -> "CheckpointSpec":
        if self.interval == "auto" and self.every_seconds is not None:
            raise ValueError("checkpoint.every_seconds conflicts with checkpoint.interval "
                             "'auto'; remove one (every_steps is the starting interval)")
        if self.interval == "auto" and self.every_steps is None:
            raise ValueError("checkpoint.interval 'auto' starts from checkpoint.every_steps; "
                             "set it to a step count or leave it at its default (10)")
        fixed = self.interval is None and self.every_seconds is None and self.every_steps
        if fixed and self.keep_every and self.keep_every % self.every_steps:
            raise ValueError(
                f"checkpoint.keep_every ({self.keep_every}) must be a multiple of "
                f"checkpoint.every_steps ({self.every_steps}), or those steps are never saved; "
                f"use a multiple of {self.every_steps}")
        return self


class FailureSpec(_Spec):
    """How failures are retried."""

    max_failures: int = Field(
        3, ge=-1, description="Worker-group restarts inside one Ray job; -1 = unlimited."
    )
    max_resubmits: int = Field(
        2, ge=0, description="Times the service resubmits the whole Ray job when its driver "
        "or cluster dies (resuming from the newest checkpoint).")
    warm_spares: bool = Field(
        True, description="Keep, on each node, one idle worker process per training worker "
        "with torch and the training code already imported, so that a worker group restarted "
        "after a failure or a resize starts in about a second instead of 5-15 s. Costs each "
        "node about 0.4 GB of host memory per worker; no GPU memory.")


class JobSpec(_Spec):
    """A training job: model, data, layout, resources, optimisation, checkpoints, failures."""

    # Inputs stay out of ValidationError's text (the API omits them too): a mistyped
    # checkpoint.storage or checkpoint.s3 value may hold a key.
    model_config = ConfigDict(**_Spec.model_config, hide_input_in_errors=True)

    name: str = Field(description="DNS-label-like job name, <= 47 characters.")
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
    def _layout_fits_workers(self) -> "JobSpec":
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
    def _layout_fits_model(self) -> "JobSpec":
        par = self.parallelism
        cfg = get_model_config(self.model.preset)
        if par.tp > 1:
            sizes = {"attention heads": cfg.n_heads, "KV heads": cfg.n_kv_heads,
                     "hidden size": cfg.dim, "FFN hidden size": cfg.ffn_hidden}
            bad = {k: v for k, v in sizes.items() if v % par.tp}
            if bad:
                raise ValueError(
                    f"parallelism.tp ({par.tp}) must divide the {', '.join(bad)} of "
                    f"model.preset {self.model.preset!r} ({', '.join(map(str, bad.values()))}); "
                    f"use a tp that divides {math.gcd(*sizes.values())}")
        stages = par.pp * (2 if par.pipeline.schedule == "interleaved_1f1b" else 1)
        if par.pp > 1 and stages > cfg.n_layers:
            raise ValueError(
                f"parallelism.pp ({par.pp}) with schedule {par.pipeline.schedule!r} needs "
                f"{stages} pipeline stages but model.preset {self.model.preset!r} has "
                f"{cfg.n_layers} layers; reduce parallelism.pp or use a deeper preset")
        if self.data.seq_len > cfg.max_seq_len:
            raise ValueError(
                f"data.seq_len ({self.data.seq_len}) exceeds the max_seq_len of model.preset "
                f"{self.model.preset!r} ({cfg.max_seq_len}); set data.seq_len <= {cfg.max_seq_len}")
        return self

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

