"""``stores``: how the spec's ``s3://`` and ``gs://`` paths are reached.

One section for every path field that may name an object store (``model.hf``,
``model.tokenizer``, ``data.path``, ``data.eval.path``, ``checkpoint.storage``, and so TensorBoard's
folder beside the checkpoints): each path's scheme selects its store, ``stores.s3``
for ``s3://`` and ``stores.gcs`` for ``gs://``. Specs written before this section
existed carried them as ``checkpoint.s3`` / ``checkpoint.gcs``:
:func:`move_legacy_stores` moves those here (the job spec calls it before validating).

Messages name the field and what is accepted, and never echo a value that may
hold a key.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from workers.spec.base import SECRET_SAFE, Spec, printable

REGION_RE = re.compile(r"[a-z0-9][-a-z0-9]{0,62}")
SECRET_NAME_RE = re.compile(r"[a-z0-9][-_a-z0-9]{0,62}")
# The sections a spec written before ``stores`` named: checkpoint.<old> -> stores.<new>.
LEGACY_SECTIONS = ("s3", "gcs")
# The fields whose scheme selects a store, as attribute paths from the spec.
PATH_FIELDS = (
    ("model", "hf"),
    ("model", "tokenizer"),
    ("data", "path"),
    ("data", "eval", "path"),
    ("checkpoint", "storage"),
    ("dpo", "reference"),  # or "base", which names no store
)


class S3Spec(Spec):
    """How every ``s3://`` path of the spec is reached: endpoint, region and which credentials.

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
                field="stores.s3.endpoint_url",
                example="http://minio:9000",
                credentials="name a secret in stores.s3.credentials_secret",
            )
        )

    @field_validator("region")
    @classmethod
    def _region_name(cls, v: str | None) -> str | None:
        if v is not None and not REGION_RE.fullmatch(v):
            raise ValueError("stores.s3.region must be a region name such as us-east-1")
        return v

    @field_validator("credentials_secret")
    @classmethod
    def _secret_is_a_name(cls, v: str | None) -> str | None:
        # Lowercase only: access key ids (AKIA...) and secret keys (mixed case, '/', '+')
        # are refused, and the message never repeats what was given.
        if v is not None and not SECRET_NAME_RE.fullmatch(v):
            raise ValueError(
                "stores.s3.credentials_secret must be the NAME of a secret (1-63 lowercase "
                "letters, digits, '-' or '_'), never a key; put the keys in "
                "ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID and ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY"
            )
        return v


class GcsSpec(Spec):
    """How every ``gs://`` path of the spec is reached when it is not storage.googleapis.com.

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
            field="stores.gcs.endpoint_url",
            example="http://gcs-emulator:9023",
            credentials="credentials come from GOOGLE_APPLICATION_CREDENTIALS",
        )
        if urlsplit(v).path:
            # pyarrow (Ray Train's view of the store) takes host:port only.
            raise ValueError(
                "stores.gcs.endpoint_url must be http(s)://host[:port] with "
                "no path, e.g. http://gcs-emulator:9023"
            )
        return v


class StoresSpec(Spec):
    """How the spec's object-store paths are reached, one entry per scheme.

    Every ``s3://`` path (``model.hf``, ``model.tokenizer``, ``data.path``,
    ``checkpoint.storage`` and TensorBoard's folder under it) is reached with
    ``stores.s3``; every ``gs://`` path with ``stores.gcs``. Local paths use neither.
    """

    model_config = SECRET_SAFE

    s3: S3Spec | None = Field(
        None,
        description="Endpoint, region and credentials secret name for every s3:// path of "
        "the spec (model.hf, model.tokenizer, data.path, data.eval.path, checkpoint.storage).",
    )
    gcs: GcsSpec | None = Field(
        None,
        description="Endpoint for every gs:// path of the spec (model.hf, model.tokenizer, "
        "data.path, data.eval.path, checkpoint.storage) that is not storage.googleapis.com.",
    )


def move_legacy_stores(data: Any) -> Any:
    """``data`` (a spec mapping) with ``checkpoint.s3`` / ``checkpoint.gcs``, the form
    before ``stores`` existed, moved to ``stores.s3`` / ``stores.gcs``.

    Raises ValueError naming both fields when a scheme is given both ways with different
    values; the same value twice is fine. Anything but mappings is left to validation.
    """
    if not isinstance(data, dict) or not isinstance(data.get("checkpoint"), dict):
        return data
    checkpoint = data["checkpoint"]
    if not any(name in checkpoint for name in LEGACY_SECTIONS):
        return data
    stores = data.get("stores")
    if stores is not None and not isinstance(stores, dict):
        return data  # validation names stores
    stores = dict(stores or {})
    checkpoint = dict(checkpoint)
    for name in LEGACY_SECTIONS:
        old = checkpoint.pop(name, None)
        if old is None:
            continue
        new = stores.get(name)
        if new is not None and _given(new) != _given(old):
            raise ValueError(
                f"checkpoint.{name} (the old place of the {name} options) and stores.{name} "
                f"differ; remove checkpoint.{name} and keep stores.{name}"
            )
        stores[name] = old
    return {**data, "checkpoint": checkpoint, "stores": stores}


def _given(section: Any) -> Any:
    """A store section's fields that are set (unset and null are the same)."""
    if isinstance(section, dict):
        return {k: v for k, v in section.items() if v is not None}
    return section


def unused_store_error(stores: StoresSpec, paths: dict[str, str | None]) -> str | None:
    """Why ``stores`` has an entry no path of ``paths`` (field name -> value) uses, or None."""
    for name, scheme in (("s3", "s3"), ("gcs", "gs")):
        if getattr(stores, name) is None:
            continue
        if not any((v or "").startswith(f"{scheme}://") for v in paths.values()):
            fields = ", ".join(paths)
            return (
                f"stores.{name} is only used by {scheme}:// paths and none of {fields} is "
                f"one; remove stores.{name} or use a {scheme}://bucket[/prefix] path"
            )
    return None


def spec_paths(spec: Any) -> dict[str, str | None]:
    """Every path field of a job spec whose scheme selects a store: dotted name -> value
    (None where the field, or the section holding it, is unset), data.sources.<i>.path
    for each mixed source."""
    paths: dict[str, str | None] = {}
    for names in PATH_FIELDS:
        value = spec
        for name in names:
            value = getattr(value, name, None) if value is not None else None
        paths[".".join(names)] = value
    for i, source in enumerate(getattr(getattr(spec, "data", None), "sources", None) or ()):
        paths[f"data.sources.{i}.path"] = source.path
    return paths


def stores_section(spec: Any) -> StoresSpec:
    """The validated ``stores`` of a spec mapping (JSON or YAML, old form included)."""
    data = move_legacy_stores(spec) if isinstance(spec, dict) else {}
    return StoresSpec.model_validate((data or {}).get("stores") or {})


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
