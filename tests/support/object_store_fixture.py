"""One fixture over both object stores on loopback, so a storage test is written once and
runs against S3 (moto) and GCS (gcp-storage-emulator)."""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass, field

import pytest

from workers.spec import StoresSpec
from workers.storage.location import StorageLocation, resolve_store


@dataclass(frozen=True)
class ObjectStore:
    """A running store: its scheme, bucket, endpoint and the credentials it accepts.

    ``env`` holds the credential variables the store accepts (the moto user's
    AWS_* keys; none for the emulator, which is reached anonymously). ``region``
    is S3's only.
    """

    scheme: str
    bucket: str
    endpoint_url: str
    env: dict[str, str] = field(default_factory=dict)
    region: str | None = None

    def uri(self, *parts: str, bucket: str | None = None) -> str:
        """``<scheme>://<bucket>/<parts...>``."""
        return posixpath.join(f"{self.scheme}://{bucket or self.bucket}", *parts)

    def checkpoint(self, *parts: str, bucket: str | None = None) -> dict:
        """A spec's ``checkpoint`` section with that prefix as its storage."""
        return {"storage": self.uri(*parts, bucket=bucket)}

    def stores(self) -> dict:
        """A spec's ``stores`` section that reaches this store (its endpoint)."""
        if self.scheme == "s3":
            return {"s3": {"endpoint_url": self.endpoint_url, "region": self.region}}
        return {"gcs": {"endpoint_url": self.endpoint_url}}

    def sections(self, *parts: str, bucket: str | None = None) -> dict:
        """``checkpoint`` and ``stores`` of a spec that checkpoints under that prefix."""
        return {"checkpoint": self.checkpoint(*parts, bucket=bucket), "stores": self.stores()}

    def stores_spec(self) -> StoresSpec:
        """:meth:`stores`, validated."""
        return StoresSpec.model_validate(self.stores())

    def location(self, *parts: str, bucket: str | None = None, **env: str) -> StorageLocation:
        """The location of that prefix as a job resolves it: with its stores section."""
        uri = self.uri(*parts, bucket=bucket)
        return resolve_store(uri, self.stores_spec(), env={**self.env, **env})

    def with_endpoint(self, endpoint_url: str) -> ObjectStore:
        """The same store reached through another endpoint."""
        return dataclasses.replace(self, endpoint_url=endpoint_url)


@pytest.fixture(params=["s3", "gs"])
def object_store(request) -> ObjectStore:
    """Each object store in turn; only the server a test runs against is started."""
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_server")
        return ObjectStore("s3", s3["bucket"], s3["endpoint_url"], dict(s3["env"]), s3["region"])
    gcs = request.getfixturevalue("gcs_server")
    return ObjectStore("gs", gcs["bucket"], gcs["endpoint_url"])
