"""Checkpoint storage: ``file://``, ``s3://`` (AWS S3, MinIO, any S3-compatible store), ``gs://``.

One :class:`StorageLocation` gives every consumer the same view of a store: an
fsspec file system (DCP writers and readers, listing, pruning), the pyarrow file
system that Ray Train's ``RunConfig(storage_path, storage_filesystem)`` takes,
and URIs for reports. Credentials are read from the environment and live only
in ``options``, which ``repr`` leaves out; error messages name where they come
from, never their values:

- ``s3://`` by default: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and
  optional ``AWS_SESSION_TOKEN``), else the default AWS chain (instance role,
  ``~/.aws``).
- ``s3://`` with ``checkpoint.s3.credentials_secret: NAME``:
  ``ETRAIN_SECRET_<NAME>_ACCESS_KEY_ID`` / ``ETRAIN_SECRET_<NAME>_SECRET_ACCESS_KEY``
  (and optional ``..._SESSION_TOKEN``), NAME upper-cased with '-' as '_'. On
  Kubernetes these are keys of the ``etrain-storage`` Secret, which the control
  plane and every Ray pod read with ``envFrom``.
- ``gs://``: ``GOOGLE_APPLICATION_CREDENTIALS`` (a credentials JSON file), else
  Google's default chain (workload identity, metadata server).
- ``gs://`` with ``checkpoint.gcs.endpoint_url`` (else ``STORAGE_EMULATOR_HOST``, as
  Google's clients read it): that JSON API endpoint, for both file systems. An
  ``http://`` endpoint (an emulator) gets anonymous requests, never credentials in
  clear text, and needs gcsfs's plain client: its default one looks up every
  bucket's type over gRPC with TLS, which no emulator serves, so the service's and
  the workers' environment must set ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``.

Importing this module imports neither torch nor pyarrow (the service uses it).
"""

from __future__ import annotations

import logging
import os
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

import fsspec

if TYPE_CHECKING:
    import pyarrow.fs
    from fsspec import AbstractFileSystem

    from workers.spec import CheckpointSpec

SCHEMES = ("file", "s3", "gs")
AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
SECRET_ENV_PREFIX = "ETRAIN_SECRET_"
GCS_CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
GCSFS_GRPC_ENV = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
PROBE_PREFIX = ".etrain-probe-"
_SECRET_PARTS = ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN")
_S3_OPTIONS = ("key", "secret", "token")  # s3fs's names for the three variables
# S3 error codes that mean the credentials themselves were refused (not a missing grant).
_BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken", "TokenRefreshRequired", "InvalidClientTokenId"}


# Their DEBUG records print signed request headers (the access key id) and bodies.
STORAGE_CLIENT_LOGGERS = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google.auth",
                          "urllib3")


def quiet_storage_loggers() -> None:
    """Keep the object-store client loggers at INFO or above, whatever the root level is."""
    level = max(logging.INFO, logging.getLogger().getEffectiveLevel())
    for name in STORAGE_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


class StorageError(ValueError):
    """A checkpoint store that cannot be used as configured; the message names the fix."""


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
        """The endpoint override (``checkpoint.s3`` or ``checkpoint.gcs``), if any."""
        return (self.options.get("endpoint_url")
                or self.options.get("client_kwargs", {}).get("endpoint_url"))

    def join(self, *parts: str) -> str:
        """A path under ``root`` as ``fs`` sees it (``bucket/prefix/a/b`` or ``/abs/a/b``)."""
        clean = [p.strip("/") for p in parts if p and p.strip("/")]
        return posixpath.join(self.root, *clean) if clean else self.root

    def uri_of(self, *parts: str) -> str:
        """The full URI of a path under ``root`` (``s3://bucket/prefix/a/b``)."""
        path = self.join(*parts)
        return f"file://{path}" if self.scheme == "file" else f"{self.scheme}://{path}"

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
        kwargs: dict[str, Any] = {"endpoint_override": self.endpoint_url, "region": region,
                                  "access_key": self.options.get("key"),
                                  "secret_key": self.options.get("secret"),
                                  "session_token": self.options.get("token")}
        return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v})

    def ray_storage(self) -> tuple[str, pyarrow.fs.FileSystem | None]:
        """``(storage_path, storage_filesystem)`` for Ray Train's ``RunConfig``.

        A local path goes alone (Ray resolves it); an object store goes as
        ``bucket/prefix`` with its file system, as Ray expects when one is given.
        """
        if self.scheme == "file":
            return self.root, None
        return self.root, self.pyarrow_fs()


def secret_env_names(name: str) -> tuple[str, str, str]:
    """Variables holding credentials secret ``name``: access key id, secret key, session token."""
    stem = f"{SECRET_ENV_PREFIX}{name.upper().replace('-', '_')}_"
    return tuple(stem + part for part in _SECRET_PARTS)  # type: ignore[return-value]


def credential_env(uri: str, *, credentials_secret: str | None = None,
                   env: Mapping[str, str] | None = None) -> dict[str, str]:
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


def resolve_storage(uri: str, *, endpoint_url: str | None = None, region: str | None = None,
                    credentials_secret: str | None = None,
                    env: Mapping[str, str] | None = None) -> StorageLocation:
    """The :class:`StorageLocation` of ``uri`` with credentials from ``env`` (default: os.environ).

    ``endpoint_url`` is ``checkpoint.s3.endpoint_url`` or ``checkpoint.gcs.endpoint_url``;
    ``region`` and ``credentials_secret`` are ``checkpoint.s3`` fields and apply to
    ``s3://`` only. Raises :class:`StorageError` for an unknown scheme, missing
    credentials or a gcsfs that cannot use the endpoint; it does not contact the
    store (see :func:`check_storage`).
    """
    env = os.environ if env is None else env
    url = urlsplit(uri)
    if url.scheme not in SCHEMES:
        raise StorageError("checkpoint.storage must be file:///abs/path, s3://bucket[/prefix] "
                           f"or gs://bucket[/prefix] (got scheme {url.scheme!r})")
    if url.scheme != "s3" and (region or credentials_secret):
        raise StorageError("checkpoint.s3 is only used with an s3:// checkpoint.storage; "
                           "remove it or use s3://bucket[/prefix]")
    if url.scheme == "file" and endpoint_url:
        raise StorageError("an endpoint_url (checkpoint.s3 or checkpoint.gcs) is only used with "
                           "s3:// or gs:// checkpoint.storage; remove it")
    if url.scheme == "file":
        if url.netloc or not url.path.startswith("/"):
            raise StorageError("checkpoint.storage must be an absolute path: file:///abs/path")
        root = posixpath.normpath(url.path)
        return StorageLocation(uri=f"file://{root}", scheme="file",
                               fs=fsspec.filesystem("file"), root=root,
                               credentials_source="local files")
    if not url.netloc or "@" in uri or ":" in url.netloc:
        raise StorageError(f"checkpoint.storage must be {url.scheme}://bucket[/prefix], with "
                           "no credentials in it")
    prefix = url.path.strip("/")
    root = f"{url.netloc}/{prefix}" if prefix else url.netloc
    if url.scheme == "s3":
        options, source = _s3_options(endpoint_url=endpoint_url, region=region,
                                      credentials_secret=credentials_secret, env=env)
    else:
        options, source = _gs_options(endpoint_url=endpoint_url, env=env)
    return StorageLocation(uri=f"{url.scheme}://{root}", scheme=url.scheme,
                           fs=fsspec.filesystem(url.scheme, **options), root=root,
                           options=options, credentials_source=source)


def resolve_checkpoint_storage(checkpoint: CheckpointSpec, *, uri: str | None = None,
                               env: Mapping[str, str] | None = None) -> StorageLocation:
    """:func:`resolve_storage` for a spec's ``checkpoint`` section.

    ``uri`` (default: ``checkpoint.storage``) may be another location, such as a
    run directory under it; the section's ``s3`` or ``gcs`` fields apply when the
    scheme of ``uri`` is theirs.
    """
    uri = uri or checkpoint.storage
    if not uri:
        raise StorageError("checkpoint.storage must be set before launch (the service fills "
                           "in its default)")
    scheme = urlsplit(uri).scheme
    s3 = checkpoint.s3 if scheme == "s3" else None
    store = s3 or (checkpoint.gcs if scheme == "gs" else None)
    return resolve_storage(uri, endpoint_url=store and store.endpoint_url,
                           region=s3 and s3.region,
                           credentials_secret=s3 and s3.credentials_secret, env=env)


def _s3_options(*, endpoint_url: str | None, region: str | None,
                credentials_secret: str | None, env: Mapping[str, str]) -> tuple[dict, str]:
    """s3fs storage options and a description (names only) of where the keys came from."""
    if credentials_secret:
        names = secret_env_names(credentials_secret)
        missing = [n for n in names[:2] if not env.get(n)]
        if missing:
            raise StorageError(
                f"checkpoint.s3.credentials_secret {credentials_secret!r}: {' and '.join(missing)} "
                f"not set in this process's environment; set {names[0]} and {names[1]} "
                f"(optionally {names[2]}), on Kubernetes as keys of the etrain-storage Secret")
        source = f"checkpoint.s3.credentials_secret {credentials_secret!r} ({names[0]}, ...)"
    else:
        names = AWS_ENV
        if bool(env.get(names[0])) != bool(env.get(names[1])):
            raise StorageError("set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                               "neither (the default AWS chain), or name a secret in "
                               "checkpoint.s3.credentials_secret")
        source = ("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" if env.get(names[0])
                  else "the default AWS credential chain")
    options: dict[str, Any] = {opt: env[name] for opt, name in zip(_S3_OPTIONS, names)
                               if env.get(name)}
    client = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region)) if v}
    if client:
        options["client_kwargs"] = client
    return options, source


def _gs_options(*, endpoint_url: str | None, env: Mapping[str, str]) -> tuple[dict, str]:
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
                f"gs:// endpoint {endpoint} (checkpoint.gcs.endpoint_url or {GCS_EMULATOR_ENV}): "
                "gcsfs would look up the bucket's type over gRPC with TLS, which a plain-http "
                "endpoint does not serve (each request would wait about a minute); set "
                f"{GCSFS_GRPC_ENV}=false in the service's and the workers' environment")
        return {**options, "token": "anon"}, "anonymous access (a plain-http endpoint)"
    path = env.get(GCS_CREDENTIALS_ENV)
    if path:
        return {**options, "token": path}, GCS_CREDENTIALS_ENV
    return options, "Google's default credential chain"


def check_storage(loc: StorageLocation, *, timeout_s: float = 10.0) -> None:
    """Raise :class:`StorageError` unless a checkpoint can be written under ``loc``.

    Writes and deletes ``<root>/.etrain-probe-<uuid>``, which fails when the
    bucket does not exist, the credentials are refused, the prefix is not
    writable or the store cannot be reached within about ``timeout_s``. The
    message names checkpoint.storage, the credential source by name and the
    fix; it never holds a credential value.
    """
    fs = _probe_fs(loc, timeout_s)
    probe = loc.join(f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}")
    try:
        if loc.scheme == "file":
            fs.makedirs(loc.root, exist_ok=True)
        fs.pipe_file(probe, b"etrain storage probe\n")
        fs.rm_file(probe)
    except Exception as e:  # noqa: BLE001 - every failure becomes one StorageError naming a fix
        raise StorageError(redact_credentials(_explain(loc, e), loc)) from e


def _probe_fs(loc: StorageLocation, timeout_s: float) -> AbstractFileSystem:
    """A fresh (uncached) file system with short timeouts: a probe must answer quickly."""
    if loc.scheme == "s3":
        config = {"connect_timeout": timeout_s, "read_timeout": timeout_s,
                  "retries": {"max_attempts": 2, "mode": "standard"}}
        return fsspec.filesystem("s3", skip_instance_cache=True,
                                 config_kwargs=config, **loc.options)
    if loc.scheme == "gs":
        return fsspec.filesystem("gs", skip_instance_cache=True, requests_timeout=timeout_s,
                                 **loc.options)
    return loc.fs


def store_error_code(e: BaseException) -> str | None:
    """The S3 error code behind an s3fs error (``NoSuchBucket``, ``AccessDenied``, ...)."""
    for err in (e, e.__cause__):
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            return response.get("Error", {}).get("Code")
    return None


def _explain(loc: StorageLocation, e: Exception) -> str:
    """What went wrong with ``loc`` and what to change, from the exception the probe raised."""
    code = store_error_code(e)
    bucket = loc.root.split("/", 1)[0]
    at = f" at {loc.endpoint_url}" if loc.endpoint_url else ""
    endpoint_field = f"checkpoint.{'gcs' if loc.scheme == 'gs' else 's3'}.endpoint_url"
    head = f"checkpoint.storage {loc.uri}"
    if loc.scheme == "file":
        return (f"{head} is not writable by the service ({type(e).__name__}: {e}); use a "
                "directory the service and every Ray worker can write")
    if code == "NoSuchBucket" or (code is None and isinstance(e, FileNotFoundError)):
        return (f"{head}: bucket {bucket!r} does not exist{at}; create it, or correct the "
                f"bucket in checkpoint.storage (or {endpoint_field})")
    if code in _BAD_CREDENTIALS:
        return (f"{head}: the store{at} rejected the credentials from {loc.credentials_source} "
                f"({code}); correct them in the service's and the workers' environment")
    if isinstance(e, PermissionError):
        return (f"{head}: the credentials from {loc.credentials_source} may not write there "
                f"({code or 'permission denied'}); grant put, get, list and delete on that "
                "prefix, or use another checkpoint.storage")
    return (f"{head}: cannot reach the store{at} ({type(e).__name__}: {e}); check "
            f"checkpoint.storage, {endpoint_field} and the network")


def redact_credentials(text: str, loc: StorageLocation) -> str:
    """``text`` with every credential value of ``loc`` replaced by ``***``."""
    for key in _S3_OPTIONS:
        value = loc.options.get(key)
        if isinstance(value, str) and len(value) >= 4 and value != "anon":
            text = text.replace(value, "***")
    return text


def _as_uri(loc: StorageLocation, path: str) -> str:
    """``path`` (from ``loc.join`` or ``loc.uri_of``) as a URI of ``loc``'s scheme."""
    if "://" in path:
        if not path.startswith(f"{loc.scheme}://"):
            raise StorageError(f"{path.split('://', 1)[0]}:// path given for a "
                               f"{loc.scheme}:// checkpoint.storage")
        return path
    return f"{loc.scheme}://{path.lstrip('/')}"


def dcp_writer(loc: StorageLocation, path: str, *, thread_count: int = 1):
    """A torch.distributed.checkpoint StorageWriter for the checkpoint folder ``path``.

    ``path`` comes from ``loc.join`` (or ``loc.uri_of``). For object stores the
    writer streams every shard straight to the store through ``loc``'s fsspec
    file system (s3fs uploads in parts as it goes): no full local copy.
    """
    if loc.scheme == "file":
        # DCP's FileSystemWriter (every file fsynced), writing back while it serializes.
        from workers.local_writer import LocalCheckpointWriter

        return LocalCheckpointWriter(_local_path(path), thread_count=thread_count)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    # An object is durable once its upload completed: there is no fsync to do
    # (DCP would fall back to os.sync() of the local disks).
    return FsspecWriter(_as_uri(loc, path), sync_files=False, thread_count=thread_count,
                        **loc.options)


def dcp_reader(loc: StorageLocation, path: str):
    """A torch.distributed.checkpoint StorageReader for the checkpoint folder ``path``.

    Object stores are read through ``loc``'s fsspec file system, shard by shard
    (ranged reads), without downloading the checkpoint first.
    """
    if loc.scheme == "file":
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(_local_path(path))
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(_as_uri(loc, path), **loc.options)


def _local_path(path: str) -> str:
    return urlsplit(path).path if path.startswith("file://") else path
