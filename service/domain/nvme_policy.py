"""The access policy's rule for DeepSpeed's NVMe offload (``parallelism.deepspeed``
``offload_optimizer`` / ``offload_param`` ``nvme``).

A job swaps only where the operator enabled it (``ETRAIN_POLICY_NVME_ROOT``, a folder on
each node's local NVMe): tenant T's jobs beneath ``<root>/T``, which is among T's write
roots and written into each job's environment (``workers.storage.nvme``), where the worker
makes and checks its folder at the moment of use. Without the setting a spec that asks
for NVMe offload is a 422 naming the field.
"""

from __future__ import annotations

from pathlib import Path

from service.settings.slices import PolicySettings
from workers.contract import DEEPSPEED
from workers.spec import JobSpec
from workers.storage.nvme import NVME_ENV


def nvme_area(settings: PolicySettings, tenant: str) -> Path | None:
    """The folder ``tenant``'s jobs swap beneath; None when NVMe offload is off."""
    return settings.nvme_root.expanduser() / tenant if settings.nvme_root else None


def nvme_env(settings: PolicySettings, tenant: str) -> dict[str, str]:
    """``{NVME_ENV: area}`` for a job's environment (empty when NVMe offload is off)."""
    area = nvme_area(settings, tenant)
    return {NVME_ENV: str(area)} if area else {}


def nvme_refusals(settings: PolicySettings, spec: JobSpec) -> list[tuple[tuple, str]]:
    """The offload fields that ask for NVMe on a service that enables none."""
    par = spec.parallelism
    if par.strategy != DEEPSPEED or settings.nvme_root is not None:
        return []
    return [
        (
            ("parallelism", "deepspeed", name),
            f"parallelism.deepspeed.{name} nvme is not enabled on this service (the operator "
            "names a folder on each node's NVMe with ETRAIN_POLICY_NVME_ROOT); use cpu or none",
        )
        for name in ("offload_optimizer", "offload_param")
        if getattr(par.deepspeed, name) == "nvme"
    ]
