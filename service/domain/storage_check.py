"""Object-storage checks at submit and plan time, and the credentials a launch forwards.

A job whose ``checkpoint.storage`` is ``s3://`` or ``gs://`` is probed with the
service's own credentials (its environment: the AWS_* variables, or the
``ETRAIN_SECRET_<NAME>_*`` ones of ``checkpoint.s3.credentials_secret``) before
it is queued, so a missing bucket or a refused key is a 422 now, not a failed
job after the first checkpoint. ``file://`` storage is not probed: the service
may not share the workers' file system (the embedded default is its own data
directory, which it created).
"""

from __future__ import annotations

from collections.abc import Mapping

from service.errors import InvalidSpec
from workers.checkpoint.probe import check_storage
from workers.checkpoint.storage import (
    StorageError,
    checkpoint_credential_env,
    resolve_checkpoint_storage,
)
from workers.spec import CheckpointSpec

OBJECT_STORE_SCHEMES = ("s3://", "gs://")


def check_checkpoint_storage(
    checkpoint: CheckpointSpec, *, env: Mapping[str, str] | None = None
) -> None:
    """Raise InvalidSpec (422) unless an object-store ``checkpoint.storage`` can be written.

    Credentials come from ``env`` (default: the service's environment); the
    error names checkpoint.storage and the fix, never a credential value.
    """
    if not (checkpoint.storage or "").startswith(OBJECT_STORE_SCHEMES):
        return
    try:
        check_storage(resolve_checkpoint_storage(checkpoint, env=env))
    except StorageError as e:
        where = (
            ["s3", "credentials_secret"]
            if str(e).startswith("checkpoint.s3.credentials_secret")
            else ["storage"]
        )
        loc = ["body", "checkpoint", *where]
        raise InvalidSpec(str(e), [{"loc": loc, "msg": str(e), "type": "storage"}]) from e


def storage_launch_env(
    checkpoint: CheckpointSpec, *, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Credential variables of the service's environment that the job's workers need.

    Only the variables the job's storage reads are returned: AWS_* for ``s3://``, or
    ``ETRAIN_SECRET_<NAME>_*`` for ``checkpoint.s3.credentials_secret: NAME``.
    """
    return checkpoint_credential_env(checkpoint, env=env)
