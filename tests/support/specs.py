"""Job-spec dicts for tests: one builder instead of a ``_spec`` per test file.

``spec(**overrides)`` deep-merges its sections into ``MINIMAL`` (the smallest valid spec:
every other field has a default); ``spec(JOB, ...)`` starts from the API tests' quick job
instead. A nested dict merges key by key; any other value replaces what was there.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# The smallest valid spec: every other field has a default.
MINIMAL: dict[str, Any] = {"name": "tiny"}
# A quick job on the fake cluster (two workers, five steps): what the REST tests submit.
JOB: dict[str, Any] = {"name": "tiny", "resources": {"workers": 2}, "train": {"steps": 5}}


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict (shares nothing with its arguments): ``base`` with ``overrides`` merged
    in, dicts into dicts, recursively."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def spec(base: Mapping[str, Any] | None = None, /, **overrides: Any) -> dict[str, Any]:
    """A job-spec dict: ``base`` (default ``MINIMAL``) with ``overrides`` deep-merged in."""
    return deep_merge(MINIMAL if base is None else base, overrides)


# The byte counts the planner gives for each rank (GET/POST /v1/plan's per_rank).
PER_RANK_KEYS = {
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "buffers_bytes",
    "total_bytes",
}

# Two 24 GiB GPUs at home and a 12 GiB laptop (cluster.gpu_nodes), and a GPU job for them:
# llama-1b under FSDP over 2 GPUs needs 21.5 GiB a rank, so only the 24 GiB GPUs hold it.
MIXED_GPU_CLUSTER = {
    "gpu_nodes": [
        {"name": "home", "count": 2, "gpu_memory_gb": 24},
        {"name": "laptop", "gpu_memory_gb": 12},
    ]
}
MIXED_GPU_JOB = {
    "name": "mixed-gpus",
    "model": {"preset": "llama-1b"},
    "data": {"seq_len": 1024},
    "resources": {"workers": 2, "gpus_per_worker": 1},
    "parallelism": {"strategy": "fsdp"},
    "train": {"global_batch_size": 24, "micro_batch_size": 1, "precision": "bf16"},
}
