"""``checkpoint``: when and where checkpoints are written, and which are kept (how an
object store is reached is the spec's ``stores`` section, :mod:`workers.spec.stores`).

Messages name the field and what is accepted, and never echo a value that may
hold a key.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from workers.spec.base import MAX_SECONDS, MAX_STEPS, SECRET_SAFE, Spec, printable

STORAGE_SCHEMES = ("file", "s3", "gs")
BUCKET_RE = {
    "s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
    "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"),
}


class CheckpointSpec(Spec):
    """When and where checkpoints are written, and which ones are kept."""

    model_config = SECRET_SAFE  # storage may carry user:key@ by mistake

    storage: str | None = Field(
        None,
        description="file:///abs/path inside the tenant's checkpoint area, "
        "<data dir>/checkpoints/<tenant> (ETRAIN_POLICY_CHECKPOINT_ROOT; the default), "
        "resolved through '..' and symlinks; or s3://bucket[/prefix] "
        "(AWS S3 or, with stores.s3.endpoint_url, MinIO or any S3-compatible store) or "
        "gs://bucket[/prefix] (Google Cloud Storage or, with stores.gcs.endpoint_url, an "
        "emulator): the scheme selects the store options, stores.s3 or stores.gcs; under "
        "a prefix the operator lists for the tenant "
        "(ETRAIN_POLICY_OBJECT_STORES). Object stores are checked for write access at submit, "
        "with the credentials the job will use.",
    )
    every_steps: int | None = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="Save every N optimizer steps; with interval 'auto', the "
        "starting interval until a save and the step time have been measured.",
    )
    every_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_SECONDS,
        description="Save when this many seconds passed since the last save.",
    )
    interval: Literal["auto"] | None = Field(
        None,
        description="'auto': choose the interval from the measured blocking cost of a "
        "save and the failure rate (Young/Daly), starting from every_steps; unset = "
        "every_steps / every_seconds as given.",
    )
    mtbf_prior_s: float = Field(
        86400.0,
        gt=0,
        le=MAX_SECONDS,
        description="Prior mean time between failures, in seconds, for "
        "interval 'auto' before failures have been observed (ignored otherwise).",
    )
    async_: bool = Field(
        False, alias="async", description="Write shards in the background (DCP async_save)."
    )
    keep_last: int = Field(3, ge=1, le=100_000, description="Newest committed checkpoints to keep.")
    keep_every: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Also keep every checkpoint whose step is a multiple of N "
        "(e.g. 1000 keeps steps 1000, 2000, ...), on top of keep_last; unset = none.",
    )
    keep_best: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Also keep the K checkpoints whose held-out loss (eval_loss) is lowest, "
        "on top of keep_last and keep_every; only checkpoints of steps that evaluated are "
        "ranked (a tie keeps the earlier step). Needs train.eval_every_steps; with a fixed "
        "every_steps, every_steps must be a multiple of it (so every save is evaluated). "
        "GET /v1/jobs/{id}/checkpoints marks the best; `etrain export --best` exports it.",
    )

    @field_validator("storage")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        return None if v is None else check_storage_uri(v)

    @model_validator(mode="after")
    def _interval_fields_agree(self) -> CheckpointSpec:
        if self.interval == "auto" and self.every_seconds is not None:
            raise ValueError(
                "checkpoint.every_seconds conflicts with checkpoint.interval "
                "'auto'; remove one (every_steps is the starting interval)"
            )
        if self.interval == "auto" and self.every_steps is None:
            raise ValueError(
                "checkpoint.interval 'auto' starts from checkpoint.every_steps; "
                "set it to a step count or leave it at its default (10)"
            )
        fixed = self.interval is None and self.every_seconds is None and self.every_steps
        if fixed and self.keep_every and self.keep_every % self.every_steps:
            raise ValueError(
                f"checkpoint.keep_every ({self.keep_every}) must be a multiple of "
                f"checkpoint.every_steps ({self.every_steps}), or those steps are never saved; "
                f"use a multiple of {self.every_steps}"
            )
        return self


def check_storage_uri(v: str) -> str:
    """Validate a ``checkpoint.storage`` URI; return it without a trailing '/'.

    Raises ValueError naming checkpoint.storage; never repeats a value that may
    hold credentials (``user:key@``, a query).
    """
    url = urlsplit(printable(v, "checkpoint.storage"))
    if url.scheme not in STORAGE_SCHEMES:
        raise ValueError(
            "checkpoint.storage must be file:///abs/path, s3://bucket[/prefix] or "
            f"gs://bucket[/prefix] (got scheme {url.scheme!r})"
        )
    # A key whose secret holds '/' splits user:key@ across netloc and path: look at both.
    if url.query or url.fragment or "@" in v or ":" in url.netloc:
        # Never echo the value: user:key@ or ?key= may hold credentials.
        raise ValueError(
            "checkpoint.storage must not carry credentials, a query or a "
            "fragment; for s3:// name a secret in stores.s3.credentials_secret"
        )
    if url.scheme == "file":
        if url.netloc or not url.path.startswith("/"):
            raise ValueError("checkpoint.storage must be an absolute path: file:///abs/path")
        return v
    bucket, prefix = url.netloc, url.path.strip("/")
    if not BUCKET_RE[url.scheme].fullmatch(bucket) or ".." in bucket:
        chars = "'-' or '.'" if url.scheme == "s3" else "'-', '_' or '.'"
        raise ValueError(
            f"checkpoint.storage bucket {bucket!r} is not a valid {url.scheme}:// bucket name: "
            f"3-63 lowercase letters, digits, {chars}, starting and ending with a letter "
            "or digit"
        )
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(
            "checkpoint.storage prefix must not contain empty, '.' or '..' "
            f"segments: use {url.scheme}://{bucket}/a/b"
        )
    return f"{url.scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
