"""Job storage: ``file://``, ``s3://`` (AWS S3, MinIO, any S3-compatible store), ``gs://``.

Which store options a URI gets is decided once, here (:func:`store_options`): its scheme
selects the spec's ``stores.s3`` (``s3://``) or ``stores.gcs`` (``gs://``), whichever
path field (``model.hf``, ``model.tokenizer``, ``data.path``, ``data.eval.path``,
``checkpoint.storage``) it comes from. One :class:`StorageLocation` gives every
consumer the same view of a store: an fsspec file system (DCP writers and readers,
listing, pruning), the pyarrow file system that Ray Train's
``RunConfig(storage_path, storage_filesystem)`` takes, and URIs for reports.
Credentials are read from the environment and live only in ``options``, which
``repr`` leaves out; error messages name where they come from, never their values:

- ``s3://`` by default: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and
  optional ``AWS_SESSION_TOKEN``), else the default AWS chain (instance role,
  ``~/.aws``).
- ``s3://`` with ``stores.s3.credentials_secret: NAME``:
  ``ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID`` / ``ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY``
  (and optional ``..._SESSION_TOKEN``), NAME upper-cased with '-' as '_'. On
  Kubernetes the control plane reads them from the ``etrain-storage`` Secret (for its
  probes) and a per-job cluster's pods get only the ones their job reads, from the
  tenant's ``etrain-storage-<tenant>`` Secret.
- ``gs://``: ``GOOGLE_APPLICATION_CREDENTIALS`` (a credentials JSON file), else
  Google's default chain (workload identity, metadata server).
- ``gs://`` with ``stores.gcs.endpoint_url`` (else ``STORAGE_EMULATOR_HOST``, as
  Google's clients read it): that JSON API endpoint, for both file systems. An
  ``http://`` endpoint (an emulator) gets anonymous requests, never credentials in
  clear text, and needs gcsfs's plain client: its default one looks up every
  bucket's type over gRPC with TLS, which no emulator serves, so the service's and
  the workers' environment must set ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``.

Importing this module imports neither torch nor pyarrow (the service uses it).
:mod:`workers.storage.probe` checks a location before a job runs;
:mod:`workers.checkpoint.dcp_io` gives DCP readers and writers for it.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import fsspec

from workers.storage.credentials import (
    AWS_ENV,
    TRACKING_VARIABLES,
    StorageError,
    gs_options,
    s3_options,
    secret_env_names,
    tracking_env_names,
)

if TYPE_CHECKING:
    import pyarrow.fs
    from fsspec import AbstractFileSystem

    # A spec's ``stores`` section (workers.spec.StoresSpec, a layer above this one):
    # read for its ``s3`` and ``gcs`` fields only.
    StoresSpec = Any

SCHEMES = ("file", "s3", "gs")
OBJECT_STORES = ("s3://", "gs://")


# Their DEBUG records print signed request headers (the access key id) and bodies.
STORAGE_CLIENT_LOGGERS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google.auth", "urllib3")


def quiet_storage_loggers() -> None:
    """Keep the object-store client loggers at INFO or above, whatever the root level is."""
    level = max(logging.INFO, logging.getLogger().getEffectiveLevel())
    for name in STORAGE_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


@dataclass(frozen=True)
class StorageLocation:
    """Where a job's checkpoints live, and the file systems that reach it.

    ``root`` is the location as ``fs`` sees it: ``/abs/path`` for ``file://``,
    ``bucket/prefix`` (no scheme) for ``s3://`` and ``gs://``. ``options`` are
    the fsspec storage options ``fs`` was built with, credentials included:
    they stay out of ``repr`` and ``str``. ``credentials_source`` says where those came
    from, by variable name only.
    """

    uri: str
    scheme: str
    fs: AbstractFileSystem = field(repr=False, compare=False)
    root: str
    options: dict = field(default_factory=dict, repr=False, compare=False)
    credentials_source: str = "none"

    def __str__(self) -> str:
        return self.uri

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint override (``stores.s3`` or ``stores.gcs``), if any."""
        return self.options.get("endpoint_url") or self.options.get("client_kwargs", {}).get(
            "endpoint_url"
        )

    def join(self, *parts: str) -> str:
        """A path under ``root`` as ``fs`` sees it (``bucket/prefix/a/b`` or ``/abs/a/b``)."""
        clean = [p.strip("/") for p in parts if p and p.strip("/")]
        return posixpath.join(self.root, *clean) if clean else self.root

    def uri_of(self, *parts: str) -> str:
        """The full URI of a path under ``root`` (``s3://bucket/prefix/a/b``)."""
        path = self.join(*parts)
        return f"file://{path}" if self.scheme == "file" else f"{self.scheme}://{path}"

    def child(self, *parts: str) -> StorageLocation:
        """The location of a folder under ``root``, on the same store with the same file
        system and options (a job's checkpoints under its storage, their event files)."""
        return replace(self, uri=self.uri_of(*parts), root=self.join(*parts))

    def pyarrow_fs(self) -> pyarrow.fs.FileSystem:
        """The same store as a pyarrow file system (what Ray Train reads and writes through).

        For ``gs://`` pyarrow reads Google credentials from this process's
        environment (``GOOGLE_APPLICATION_CREDENTIALS`` or the default chain) unless
        ``fs`` is anonymous. For AWS S3 without a region the bucket's region is looked
        up (one request).
        """
        import pyarrow.fs as pafs

        if self.scheme == "file":
            return pafs.LocalFileSystem()
        if self.scheme == "gs":
            gcs: dict[str, Any] = {"anonymous": self.options.get("token") == "anon"}
            if self.endpoint_url:  # pyarrow takes host:port and the scheme apart
                url = urlsplit(self.endpoint_url)
                gcs.update(endpoint_override=url.netloc, scheme=url.scheme)
            return pafs.GcsFileSystem(**gcs)
        region = self.options.get("client_kwargs", {}).get("region_name")
        if not region and not self.endpoint_url:
            # As Ray's own FileSystem.from_uri does: pyarrow does not follow S3's region
            # redirects (s3fs does), so an AWS bucket outside the default region needs it.
            try:
                region = pafs.resolve_s3_region(self.root.split("/", 1)[0])
            except OSError:
                region = None  # not reachable from here: the SDK's default applies
        kwargs: dict[str, Any] = {
            "endpoint_override": self.endpoint_url,
            "region": region,
            "access_key": self.options.get("key"),
            "secret_key": self.options.get("secret"),
            "session_token": self.options.get("token"),
        }
        return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v})

    def ray_storage(self) -> tuple[str, pyarrow.fs.FileSystem | None]:
        """``(storage_path, storage_filesystem)`` for Ray Train's ``RunConfig``.

        A local path goes alone (Ray resolves it); an object store goes as
        ``bucket/prefix`` with its file system, as Ray expects when one is given.
        """
        if self.scheme == "file":
            return self.root, None
        return self.root, self.pyarrow_fs()


def is_remote(uri: str | None) -> bool:
    """Whether ``uri`` names an object store (``s3://`` or ``gs://``): the one rule, which
    the service and every loader ask."""
    return bool(uri) and str(uri).startswith(OBJECT_STORES)


def locate(place: str, stores: StoresSpec | None = None) -> StorageLocation:
    """A place given as a local path or a URI (``file://``, ``s3://``, ``gs://``) as its
    :class:`StorageLocation`, reached with ``stores``' options where its scheme selects them:
    what a job's driver, or a test or benchmark running the loop itself, hands the loop."""
    place = str(place)
    uri = place if "://" in place else f"file://{os.path.abspath(place)}"
    return resolve_store(uri, stores)


def stores_for(stores: StoresSpec | None) -> Callable[[str], StorageLocation]:
    """A URL -> its StorageLocation, with the spec's ``stores`` options where the scheme is
    theirs: how a job reaches ``model.hf``, ``model.tokenizer``, ``data.path``,
    ``data.eval.path``, its checkpoints and TensorBoard's folder as its workers do.
    Without a section, this process's defaults."""
    return lambda uri: resolve_store(uri, stores)


def credential_env(
    uri: str, *, credentials_secret: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The credential variables :func:`resolve_storage` reads for ``uri`` that ``env`` sets.

    This is what a worker needs in its environment to reach the store the way
    this process does. Empty for ``file://`` and ``gs://`` (a credentials file
    path would not exist on other machines).
    """
    env = os.environ if env is None else env
    if urlsplit(uri).scheme != "s3":
        return {}
    names = secret_env_names(credentials_secret) if credentials_secret else AWS_ENV
    return {name: env[name] for name in names if env.get(name)}


def _check_options_fit(
    scheme: str, *, endpoint_url: str | None, region: str | None, credentials_secret: str | None
) -> None:
    """Refuse an unknown scheme, and store options given for a scheme that has no use for them."""
    if scheme not in SCHEMES:
        raise StorageError(
            "checkpoint.storage must be file:///abs/path, s3://bucket[/prefix] "
            f"or gs://bucket[/prefix] (got scheme {scheme!r})"
        )
    if scheme != "s3" and (region or credentials_secret):
        raise StorageError(
            "stores.s3 (region, credentials_secret) is only used with s3:// paths; "
            "remove it or use s3://bucket[/prefix]"
        )
    if scheme == "file" and endpoint_url:
        raise StorageError(
            "an endpoint_url (stores.s3 or stores.gcs) is only used with "
            "s3:// or gs:// paths; remove it"
        )


def resolve_storage(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    credentials_secret: str | None = None,
    env: Mapping[str, str] | None = None,
) -> StorageLocation:
    """The :class:`StorageLocation` of ``uri`` with credentials from ``env`` (default: os.environ).

    ``endpoint_url`` is ``stores.s3.endpoint_url`` or ``stores.gcs.endpoint_url``;
    ``region`` and ``credentials_secret`` are ``stores.s3`` fields and apply to
    ``s3://`` only. Raises :class:`StorageError` for an unknown scheme, missing
    credentials or a gcsfs that cannot use the endpoint; it does not contact the
    store (see :func:`check_storage`).
    """
    env = os.environ if env is None else env
    url = urlsplit(uri)
    _check_options_fit(
        url.scheme, endpoint_url=endpoint_url, region=region, credentials_secret=credentials_secret
    )
    if url.scheme == "file":
        if url.netloc or not url.path.startswith("/"):
            raise StorageError("checkpoint.storage must be an absolute path: file:///abs/path")
        root = posixpath.normpath(url.path)
        return StorageLocation(
            uri=f"file://{root}",
            scheme="file",
            fs=fsspec.filesystem("file"),
            root=root,
            credentials_source="local files",
        )
    if not url.netloc or "@" in uri or ":" in url.netloc:
        raise StorageError(
            f"checkpoint.storage must be {url.scheme}://bucket[/prefix], with no credentials in it"
        )
    prefix = url.path.strip("/")
    root = f"{url.netloc}/{prefix}" if prefix else url.netloc
    if url.scheme == "s3":
        options, source = s3_options(
            endpoint_url=endpoint_url, region=region, credentials_secret=credentials_secret, env=env
        )
    else:
        options, source = gs_options(endpoint_url=endpoint_url, env=env)
    return StorageLocation(
        uri=f"{url.scheme}://{root}",
        scheme=url.scheme,
        fs=fsspec.filesystem(url.scheme, **options),
        root=root,
        options=options,
        credentials_source=source,
    )


def store_options(stores: StoresSpec | None, scheme: str) -> dict[str, str | None]:
    """The ``stores.s3`` / ``stores.gcs`` fields that apply to a URI of ``scheme``, as
    :func:`resolve_storage` takes them: the one rule from a spec to a store (``s3://``
    gets ``stores.s3``, ``gs://`` ``stores.gcs``, anything else none)."""
    s3 = getattr(stores, "s3", None) if scheme == "s3" else None
    store = s3 or (getattr(stores, "gcs", None) if scheme == "gs" else None)
    return {
        "endpoint_url": store.endpoint_url if store else None,
        "region": s3.region if s3 else None,
        "credentials_secret": s3.credentials_secret if s3 else None,
    }


def resolve_store(
    uri: str, stores: StoresSpec | None, *, env: Mapping[str, str] | None = None
) -> StorageLocation:
    """:func:`resolve_storage` of ``uri`` (any path field of a spec: ``checkpoint.storage``
    or a folder under it, ``model.hf``, ``model.tokenizer``, ``data.path``,
    ``data.eval.path``) with the spec's
    ``stores`` options its scheme selects (:func:`store_options`)."""
    return resolve_storage(uri, **store_options(stores, urlsplit(uri).scheme), env=env)


def job_store_uris(spec) -> list[str]:
    """Every store location ``spec`` names: ``checkpoint.storage``, ``model.hf``,
    ``model.tokenizer``, ``data.path`` (or each ``data.sources.<i>.path``) and
    ``data.eval.path`` (those that are set), in that order."""
    # Every section naming samples: data (or its mixed sources), then data.eval.
    sections = spec.data.sections() if hasattr(spec.data, "sections") else [spec.data]
    places = (
        spec.checkpoint.storage,
        spec.model.hf,
        spec.model.tokenizer,
        *(section.path for section in sections),
    )
    return [uri for uri in places if uri]


def job_store_env_names(spec) -> tuple[str, ...]:
    """The credential variables (names only) a job's workers read for every store ``spec``
    names: per ``s3://`` location ``stores.s3.credentials_secret``'s, else AWS_*."""
    names: dict[str, None] = {}
    for uri in job_store_uris(spec):
        if urlsplit(uri).scheme == "s3":
            secret = store_options(spec.stores, "s3")["credentials_secret"]
            names.update(dict.fromkeys(secret_env_names(secret) if secret else AWS_ENV))
    return tuple(names)


def job_tracking_env_names(spec) -> tuple[str, ...]:
    """The variables (names only) of the experiment trackers' secrets ``spec`` names
    (``metrics.mlflow`` / ``metrics.wandb`` ``credentials_secret``), for rank 0."""
    names: dict[str, None] = {}
    for tracker in TRACKING_VARIABLES:
        section = getattr(getattr(spec, "metrics", None), tracker, None)
        secret = getattr(section, "credentials_secret", None)
        if secret:
            names.update(dict.fromkeys(tracking_env_names(tracker, secret)))
    return tuple(names)


def job_credential_env_names(spec) -> tuple[str, ...]:
    """Every credential variable (names only) a job's workers read: its stores'
    (:func:`job_store_env_names`), then its trackers' (:func:`job_tracking_env_names`)."""
    return (*job_store_env_names(spec), *job_tracking_env_names(spec))


def job_credential_env(spec, *, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The credential variables of ``env`` (default: this process's) that a job's workers
    need for every store ``spec`` names (see :func:`job_store_uris`): to read its model,
    tokenizer and data and to write its checkpoints, whichever of them is in an object
    store; and the secrets of its experiment trackers."""
    env = os.environ if env is None else env
    return {name: env[name] for name in job_credential_env_names(spec) if env.get(name)}
