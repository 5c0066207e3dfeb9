"""Where a store's credentials come from: variable names, and the fsspec options built
from them (by name only in every message; values never leave ``options``).

- ``s3://``: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (optional
  ``AWS_SESSION_TOKEN``), else the default AWS chain; with a ``credentials_secret`` NAME,
  ``ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID`` / ``..._SECRET_ACCESS_KEY`` instead.
- ``gs://``: ``GOOGLE_APPLICATION_CREDENTIALS``, else Google's default chain; an
  ``http://`` endpoint (an emulator) is reached anonymously.
- Experiment trackers (``metrics.mlflow``, ``metrics.wandb``) with a ``credentials_secret``
  NAME: ``ETRAIN_SECRET_<NAME>_MLFLOW_TRACKING_TOKEN`` (or ``..._USERNAME`` /
  ``..._PASSWORD``), ``ETRAIN_SECRET_<NAME>_WANDB_API_KEY``.

:mod:`workers.storage.location` turns a URI and these options into a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec

AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
SECRET_ENV_PREFIX = "ETRAIN_SECRET_"
GCS_CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
GCSFS_GRPC_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
_SECRET_PARTS = ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN")
S3_OPTIONS = ("key", "secret", "token")  # s3fs's names for the three variables
# Experiment trackers (metrics.mlflow / metrics.wandb ``credentials_secret``): the variables
# each one's client reads, as the secret's variables end (all optional: a tracker that
# refuses the run costs the job its curves, never the job).
TRACKING_VARIABLES = {
    "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "wandb": ("WANDB_API_KEY",),
}


class StorageError(ValueError):
    """A checkpoint store that cannot be used as configured; the message names the fix."""


def _stem(name: str) -> str:
    return f"{SECRET_ENV_PREFIX}{name.upper().replace('-', '_')}_"


def secret_env_names(name: str) -> tuple[str, str, str]:
    """Variables holding credentials secret ``name``: access key id, secret key, session token."""
    return tuple(_stem(name) + part for part in _SECRET_PARTS)  # type: ignore[return-value]


def tracking_env_names(tracker: str, name: str) -> tuple[str, ...]:
    """Variables holding experiment-tracker secret ``name`` for ``tracker`` (a key of
    :data:`TRACKING_VARIABLES`): ``ETRAIN_SECRET_<NAME>_<the tracker's own variable>``."""
    return tuple(_stem(name) + var for var in TRACKING_VARIABLES[tracker])


def s3_options(
    *,
    endpoint_url: str | None,
    region: str | None,
    credentials_secret: str | None,
    env: Mapping[str, str],
) -> tuple[dict, str]:
    """s3fs storage options and a description (names only) of where the keys came from."""
    if credentials_secret:
        names = secret_env_names(credentials_secret)
        missing = [n for n in names[:2] if not env.get(n)]
        if missing:
            raise StorageError(
                f"stores.s3.credentials_secret {credentials_secret!r}: {' and '.join(missing)} "
                f"not set in this process's environment; set {names[0]} and {names[1]} "
                f"(optionally {names[2]}), on Kubernetes as keys of the etrain-storage Secret"
            )
        source = f"stores.s3.credentials_secret {credentials_secret!r} ({names[0]}, ...)"
    else:
        names = AWS_ENV
        if bool(env.get(names[0])) != bool(env.get(names[1])):
            raise StorageError(
                "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                "neither (the default AWS chain), or name a secret in "
                "stores.s3.credentials_secret"
            )
        source = (
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
            if env.get(names[0])
            else "the default AWS credential chain"
        )
    options: dict[str, Any] = {
        opt: env[name] for opt, name in zip(S3_OPTIONS, names, strict=True) if env.get(name)
    }
    client = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region)) if v}
    if client:
        options["client_kwargs"] = client
    return options, source


def gs_options(*, endpoint_url: str | None, env: Mapping[str, str]) -> tuple[dict, str]:
    """gcsfs storage options and a description (names only) of the credentials' source."""
    endpoint = endpoint_url or env.get(GCS_EMULATOR_ENV, "").rstrip("/")
    if endpoint in ("", "default"):  # "default" means Google to Google's clients
        endpoint = ""
    elif "://" not in endpoint:
        endpoint = f"http://{endpoint}"  # STORAGE_EMULATOR_HOST may be host:port
    options: dict[str, Any] = {"endpoint_url": endpoint} if endpoint else {}
    if endpoint.startswith("http://"):
        import gcsfs.core

        if fsspec.get_filesystem_class("gs") is not gcsfs.core.GCSFileSystem:
            raise StorageError(
                f"gs:// endpoint {endpoint} (stores.gcs.endpoint_url or {GCS_EMULATOR_ENV}): "
                "gcsfs would look up the bucket's type over gRPC with TLS, which a plain-http "
                "endpoint does not serve (each request would wait about a minute); set "
                f"{GCSFS_GRPC_ENV}=false in the service's and the workers' environment"
            )
        return {**options, "token": "anon"}, "anonymous access (a plain-http endpoint)"
    path = env.get(GCS_CREDENTIALS_ENV)
    if path:
        return {**options, "token": path}, GCS_CREDENTIALS_ENV
    return options, "Google's default credential chain"
