"""The folder a DeepSpeed job swaps to under NVMe offload, chosen and checked on its node.

The operator enables NVMe offload by naming a folder on each node's local NVMe
(``ETRAIN_POLICY_NVME_ROOT``). The service writes tenant T's part of it, ``<root>/T``, into
each of T's jobs' environment (:data:`NVME_ENV`) and among the job's write roots
(``ETRAIN_STORAGE_ROOTS``). A spec names no path: DeepSpeed deletes and re-creates the
folders it swaps to beneath the path it is given, so a path of the tenant's choosing would
delete what it names. A job swaps beneath ``<area>/<job id>``, made at the moment of use
beneath the write roots with no link on the way (:func:`~workers.storage.confine.check_folder`),
and each rank removes its own swap files when it ends.

Torch-free.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Mapping

from workers.storage.confine import ConfinementError, Roots, check_folder, child_name

NVME_ENV = "ETRAIN_NVME_ROOT"
# DeepSpeed swaps in blocks of its aio block size (1 MiB) and only tensors of at least one
# block; a swap buffer holds a whole number of blocks.
AIO_BLOCK_BYTES = 1024 * 1024


def swap_folder(job_id: str, env: Mapping[str, str] | None = None) -> str:
    """The folder this job's ranks swap beneath, made now beneath the job's write roots.

    Raises :class:`ConfinementError` naming the field when the job has no NVMe area (the
    service enables none) or its area is not a folder it may write (a link out, another
    tenant's).
    """
    environ = os.environ if env is None else env
    area = environ.get(NVME_ENV)
    if not area:
        raise ConfinementError(
            "parallelism.deepspeed offload nvme: this job has no NVMe offload folder (the "
            "operator enables one with ETRAIN_POLICY_NVME_ROOT); use offload cpu or none"
        )
    name = child_name(job_id, where=f"{NVME_ENV} job folder")
    return check_folder(os.path.join(area, name), Roots.from_env(environ), write=True, create=True)


def swap_buffer_elements(pieces: list[int], itemsize: int = 4) -> int:
    """DeepSpeed's parameter swap buffer size (``offload_param.buffer_size``, elements):
    the largest parameter piece a rank swaps, in whole aio blocks (its default, 1e8
    elements, would hold 400 MB per buffer whatever the model)."""
    block = AIO_BLOCK_BYTES // itemsize
    return block * max(1, math.ceil(max(pieces, default=0) / block))


def rank_swap_folders(folder: str, rank: int) -> list[str]:
    """The folders rank ``rank`` swaps to beneath ``folder``: DeepSpeed's
    ``zero_stage_3/<kind>/rank<r>``, one per kind (parameters, optimizer) it made."""
    base = os.path.join(folder, "zero_stage_3")
    kinds = os.listdir(base) if os.path.isdir(base) else []
    return [os.path.join(base, kind, f"rank{rank}") for kind in kinds]


def remove_rank_swap(folder: str, rank: int) -> None:
    """Remove what rank ``rank`` swapped beneath ``folder``, and the folders left empty."""
    for mine in rank_swap_folders(folder, rank):
        shutil.rmtree(mine, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(mine))
    for empty in (os.path.join(folder, "zero_stage_3"), folder):
        with contextlib.suppress(OSError):
            os.rmdir(empty)
