"""The job spec's ``metrics`` section: what the job writes for people to watch.

``tensorboard``: event files beside the checkpoints. ``mlflow`` and ``wandb``: the run in
the team's experiment tracker (:mod:`workers.telemetry.tracking`). A tracker's token or
API key never appears in a spec: ``credentials_secret`` names a secret, whose values the
workers read from ``ETRAIN_SECRET_<NAME>_<VARIABLE>`` (NAME upper-cased with '-' as '_';
:func:`workers.storage.credentials.tracking_env_names`), as for ``stores.s3``.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from workers.spec.base import SECRET_SAFE, Spec, printable
from workers.spec.stores import SECRET_NAME_RE, check_endpoint_url

# W&B's own rule for project and entity names: no '/', '\\', '#', '?', '%' or ':'.
WANDB_NAME_RE = re.compile(r"[^/\\#?%:\s][^/\\#?%:]{0,127}")
_EXPERIMENT_MAX = 500


def _secret_name(v: str | None, *, field: str, variables: str) -> str | None:
    # Lowercase names only, so a token or key pasted here is refused (never repeated).
    if v is not None and not SECRET_NAME_RE.fullmatch(v):
        raise ValueError(
            f"{field} must be the NAME of a secret (1-63 lowercase letters, digits, '-' or "
            f"'_'), never a token or key; put the values in {variables}"
        )
    return v


_SECRET_DESCRIPTION = (
    "NAME of a secret (never a token or key): the workers read {variables} from their "
    "environment, which the service fills from its own like stores.s3.credentials_secret's "
    "(on Kubernetes, keys of the tenant's etrain-storage-<tenant> Secret). A tenant may name "
    "only its own secrets (ETRAIN_POLICY_SECRETS). Unset = no credentials are sent."
)


class MlflowSpec(Spec):
    """The job as one MLflow run: params, per-step metrics, events, the final checkpoint."""

    model_config = SECRET_SAFE  # a mistyped URI may hold user:password

    tracking_uri: str = Field(
        description="The MLflow tracking server, http(s)://host[:port][/path] (never with "
        "user:password@: name a credentials_secret), or a local store "
        "file:///absolute/folder inside the tenant's checkpoint area (a SQLite store "
        "mlflow.db and artifacts/ there: mlflow ui --backend-store-uri "
        "sqlite:///<folder>/mlflow.db). The operator may list "
        "the servers each tenant may use (ETRAIN_POLICY_TRACKING_URIS).",
    )
    experiment: str = Field(
        description="The MLflow experiment the run goes in (made when it does not exist). "
        "The run is named after the job and tagged etrain.job_id; a restarted job continues "
        "its run.",
    )
    log_model: bool = Field(
        False,
        description="At the end, log the final checkpoint as the run's model: the "
        "artifact folder model/ holding it exported as `etrain export` writes it (a LoRA "
        "job's adapter in peft's format, a model.hf job's Hugging Face folder, a preset's "
        "model.safetensors and config.json), checkpoint.json (its URI, step, size, "
        "eval_loss) and the tag etrain.checkpoint.",
    )
    credentials_secret: str | None = Field(
        None,
        description=_SECRET_DESCRIPTION.format(
            variables="ETRAIN_SECRET_<NAME>_MLFLOW_TRACKING_TOKEN (a bearer token) or "
            "ETRAIN_SECRET_<NAME>_MLFLOW_TRACKING_USERNAME and ..._MLFLOW_TRACKING_PASSWORD"
        ),
    )

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        field = "metrics.mlflow.tracking_uri"
        if urlsplit(printable(v, field)).scheme == "file":
            url = urlsplit(v)
            if url.netloc or not url.path.startswith("/") or url.query or url.fragment:
                raise ValueError(f"{field} file: stores must be file:///absolute/folder")
            return v.rstrip("/")
        return check_endpoint_url(
            v,
            field=field,
            example="https://mlflow.example.com (or file:///absolute/folder)",
            credentials="name a secret in metrics.mlflow.credentials_secret",
        )

    @field_validator("experiment")
    @classmethod
    def _experiment(cls, v: str) -> str:
        if not v.strip() or len(v) > _EXPERIMENT_MAX:
            raise ValueError(f"metrics.mlflow.experiment must be 1-{_EXPERIMENT_MAX} characters")
        return printable(v, "metrics.mlflow.experiment")

    @field_validator("credentials_secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        return _secret_name(
            v,
            field="metrics.mlflow.credentials_secret",
            variables="ETRAIN_SECRET_<NAME>_MLFLOW_TRACKING_TOKEN",
        )


class WandbSpec(Spec):
    """The job as one Weights & Biases run: config, per-step metrics, events, the final
    checkpoint."""

    model_config = SECRET_SAFE  # an API key pasted in the wrong field

    project: str = Field(description="The W&B project the run goes in.")
    entity: str | None = Field(
        None, description="The W&B team or user that owns the project; unset = the key's own."
    )
    mode: Literal["online", "offline"] = Field(
        "online",
        description="online: sent to W&B (WANDB_BASE_URL of the workers' environment, else "
        "api.wandb.ai) as the run goes; offline: written only as files under "
        "<checkpoint storage>/<job id>/checkpoints/wandb, for `wandb sync` later.",
    )
    log_model: bool = Field(
        False,
        description="At the end, log the final checkpoint as a model artifact "
        "<job id>-checkpoint holding checkpoint.json (its URI, step, size, eval_loss) and "
        "model/: the checkpoint exported as `etrain export` writes it (a LoRA job's adapter "
        "in peft's format, a model.hf job's Hugging Face folder, a preset's "
        "model.safetensors and config.json).",
    )
    credentials_secret: str | None = Field(
        None,
        description=_SECRET_DESCRIPTION.format(variables="ETRAIN_SECRET_<NAME>_WANDB_API_KEY"),
    )

    @field_validator("project", "entity")
    @classmethod
    def _name(cls, v: str | None, info) -> str | None:
        if v is not None and not WANDB_NAME_RE.fullmatch(v):
            raise ValueError(
                f"metrics.wandb.{info.field_name} must be 1-128 characters without '/', '\\', "
                "'#', '?', '%', ':' or a leading space"
            )
        return v

    @field_validator("credentials_secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        return _secret_name(
            v,
            field="metrics.wandb.credentials_secret",
            variables="ETRAIN_SECRET_<NAME>_WANDB_API_KEY",
        )


class MetricsSpec(Spec):
    """Training curves: TensorBoard files beside the checkpoints, and experiment trackers."""

    tensorboard: bool | None = Field(
        None,
        description="Rank 0 writes the per-step scalars (loss, lr, grad norm, tokens/s, "
        "samples/s, step time, world size; eval/loss and eval/perplexity on the steps that "
        "evaluate) and the job's events (starts, restores, resizes, "
        "checkpoints) as TensorBoard event files under "
        "<checkpoint storage>/<job id>/checkpoints/tensorboard, from a background thread, on "
        "local and object storage (s3://, gs://, reached like checkpoint.storage with "
        "stores.s3 / stores.gcs: written locally and copied to the store "
        "every 10 s, before each checkpoint commits and at the end). "
        "Unset: the service's ETRAIN_TENSORBOARD_DEFAULT.",
    )
    mlflow: MlflowSpec | None = Field(
        None,
        description="Rank 0 logs the run to MLflow from a background thread: the whole spec "
        "as params (flattened, e.g. train.lr), the per-step metrics (loss, lr, grad_norm, "
        "tokens_per_s, ...; eval_loss and eval_perplexity on the steps that evaluate), each "
        "job event as a tag event.<step>.<kind> and a line of the events.txt artifact. A "
        "tracking server that is down or slow never holds the job up: what it does not take "
        "in time is dropped and a tracking_failed event says so.",
    )
    wandb: WandbSpec | None = Field(
        None,
        description="Rank 0 logs the run to Weights & Biases from a background thread: the "
        "whole spec as config (flattened), the per-step metrics as train/* and eval/* against "
        "train/step, each job event as a marker events/<kind> at its step and a line of the "
        "run's notes. A W&B that is down or slow never holds the job up (a tracking_failed "
        "event says what was lost).",
    )
