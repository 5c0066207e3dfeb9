"""``checkpoint``: when and where checkpoints are written, which are kept, and how the
object store (``checkpoint.s3``, ``checkpoint.gcs``) is reached.

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
REGION_RE = re.compile(r"[a-z0-9][-a-z0-9]{0,62}")
SECRET_NAME_RE = re.compile(r"[a-z0-9][-_a-z0-9]{0,62}")


class S3Spec(Spec):
    """How to reach an ``s3://`` checkpoint store: endpoint, region and which credentials.

    Credentials never appear in a spec. Without ``credentials_secret`` they come from
    the standard ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and optional
    ``AWS_SESSION_TOKEN``) environment variables, else the default AWS chain (instance
    role, ``~/.aws``). With ``credentials_secret: NAME`` they come from
    ``ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID`` / ``ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY``
    (and optional ``..._SESSION_TOKEN``), NAME upper-cased with '-' as '_'. Which NAMEs a
    tenant may use, and whether it may use the service's own keys, is the operator's access
    policy. On Kubernetes a per-job cluster's pods get only these keys, from the tenant's
    own ``etrain-storage-<tenant>`` Secret.
    """

    model_config = SECRET_SAFE  # a mistyped value here may be a key

    endpoint_url: str | None = Field(
        None,
        description="S3 API endpoint, http(s)://host[:port], for MinIO and other "
        "S3-compatible stores; unset = AWS S3. Only endpoints the operator lists for the "
        "tenant (ETRAIN_POLICY_ENDPOINTS) are accepted.",
    )
    region: str | None = Field(
        None, description="Region of the bucket, e.g. us-east-1; unset = the SDK's default."
    )
    credentials_secret: str | None = Field(
        None,
        description="NAME of a credentials secret (never a key): its values are read "
        "from ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID and ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY "
        "in the service's and the workers' environment; unset = the AWS_* variables. A "
        "tenant may name only its own secrets (default: the one named after the tenant; "
        "ETRAIN_POLICY_SECRETS) and, unless the operator allows it "
        "(ETRAIN_POLICY_AMBIENT_CREDENTIALS), must name one.",
    )

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_is_a_url(cls, v: str | None) -> str | None:
        return (
            None
            if v is None
            else check_endpoint_url(
                v,
                field="checkpoint.s3.endpoint_url",
                example="http://minio:9000",
                credentials="name a secret in checkpoint.s3.credentials_secret",
            )
        )

    @field_validator("region")
    @classmethod
    def _region_name(cls, v: str | None) -> str | None:
        if v is not None and not REGION_RE.fullmatch(v):
            raise ValueError("checkpoint.s3.region must be a region name such as us-east-1")
        return v

    @field_validator("credentials_secret")
    @classmethod
    def _secret_is_a_name(cls, v: str | None) -> str | None:
        # Lowercase only: access key ids (AKIA...) and secret keys (mixed case, '/', '+')
        # are refused, and the message never repeats what was given.
        if v is not None and not SECRET_NAME_RE.fullmatch(v):
            raise ValueError(
                "checkpoint.s3.credentials_secret must be the NAME of a secret (1-63 lowercase "
                "letters, digits, '-' or '_'), never a key; put the keys in "
                "ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID and ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY"
            )
        return v


class GcsSpec(Spec):
    """How to reach a ``gs://`` checkpoint store that is not storage.googleapis.com.

    Credentials never appear in a spec: ``GOOGLE_APPLICATION_CREDENTIALS`` (a
    credentials JSON file), else Google's default chain, for Google and
    ``https://`` endpoints. Requests to a plain ``http://`` endpoint (an emulator)
    are anonymous: Google credentials are never sent in clear text.
    """

    model_config = SECRET_SAFE

    endpoint_url: str | None = Field(
        None,
        description="GCS JSON API endpoint, http(s)://host[:port] with no path: an "
        "emulator (fake-gcs-server, gcp-storage-emulator; http:// is anonymous) or a private "
        "endpoint (https:// uses the Google credentials); unset = STORAGE_EMULATOR_HOST when "
        "set, else storage.googleapis.com. Only endpoints the operator lists for the tenant "
        "(ETRAIN_POLICY_ENDPOINTS) are accepted.",
    )

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_is_a_host(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = check_endpoint_url(
            v,
            field="checkpoint.gcs.endpoint_url",
            example="http://gcs-emulator:9023",
            credentials="credentials come from GOOGLE_APPLICATION_CREDENTIALS",
        )
        if urlsplit(v).path:
            # pyarrow (Ray Train's view of the store) takes host:port only.
            raise ValueError(
                "checkpoint.gcs.endpoint_url must be http(s)://host[:port] with "
                "no path, e.g. http://gcs-emulator:9023"
            )
        return v


class CheckpointSpec(Spec):
    """When and where checkpoints are written, and which ones are kept."""

    model_config = SECRET_SAFE  # storage may carry user:key@ by mistake

    storage: str | None = Field(
        None,
        description="file:///abs/path inside the tenant's checkpoint area, "
        "<data dir>/checkpoints/<tenant> (ETRAIN_POLICY_CHECKPOINT_ROOT; the default), "
        "resolved through '..' and symlinks; or s3://bucket[/prefix] "
        "(AWS S3 or, with checkpoint.s3.endpoint_url, MinIO or any S3-compatible store) or "
        "gs://bucket[/prefix] (Google Cloud Storage or, with checkpoint.gcs.endpoint_url, an "
        "emulator) under a prefix the operator lists for the tenant "
        "(ETRAIN_POLICY_OBJECT_STORES). Object stores are checked for write access at submit, "
        "with the credentials the job will use.",
    )
    s3: S3Spec | None = Field(
        None, description="Endpoint, region and credentials secret name for s3:// storage."
    )
    gcs: GcsSpec | None = Field(
        None, description="Endpoint for gs:// storage that is not storage.googleapis.com."
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

    @field_validator("storage")
    @classmethod
    def _known_scheme(cls, v: str | None) -> str | None:
        return None if v is None else check_storage_uri(v)

    @model_validator(mode="after")
    def _store_options_match_the_scheme(self) -> CheckpointSpec:
        if self.s3 is not None and not (self.storage or "").startswith("s3://"):
            raise ValueError(
                "checkpoint.s3 is only used with an s3:// checkpoint.storage; "
                "remove it or set checkpoint.storage to s3://bucket[/prefix]"
            )
        if self.gcs is not None and not (self.storage or "").startswith("gs://"):
            raise ValueError(
                "checkpoint.gcs is only used with a gs:// checkpoint.storage; "
                "remove it or set checkpoint.storage to gs://bucket[/prefix]"
            )
        return self

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


def check_endpoint_url(v: str, *, field: str, example: str, credentials: str) -> str:
    """Validate an object-store endpoint ``v`` for ``field``; return it without a trailing '/'.

    Raises ValueError naming ``field`` (with ``example``, and ``credentials``: where
    keys go instead); never repeats ``v``, which may hold a key.
    """
    # urlsplit drops tabs and newlines silently: refuse every control character first.
    url = urlsplit(printable(v, field))
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{field} must be http(s)://host[:port], e.g. {example}")
    if url.username or url.password or url.query or url.fragment:
        raise ValueError(
            f"{field} must not carry credentials, a query or a fragment; {credentials}"
        )
    return v.rstrip("/")


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
            "fragment; for s3:// name a secret in checkpoint.s3.credentials_secret"
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
