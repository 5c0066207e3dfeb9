"""Datasets and the world-size independent, resumable global-batch sampler.

The names below load lazily, so that the torch-free modules of this package
(``formats``, ``tokens``, ``tokenizer``, ``prepare``) can be imported without
torch: ``etrain data prepare`` and the service's submit-time data check use them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.data.datasets import (
        IGNORE_INDEX,
        SOURCES,
        ByteWindowDataset,
        SyntheticDataset,
        TokenDataset,
        build_dataset,
        dataset_for,
    )
    from workers.data.sampler import (
        GlobalBatchSampler,
        SamplerState,
        collate,
        counted_labels,
        shard_global_batch,
    )

_DATASETS = (
    "IGNORE_INDEX",
    "SOURCES",
    "ByteWindowDataset",
    "SyntheticDataset",
    "TokenDataset",
    "build_dataset",
    "dataset_for",
)
_SAMPLER = ("GlobalBatchSampler", "SamplerState", "collate", "counted_labels", "shard_global_batch")
__all__ = [
    "IGNORE_INDEX",
    "SOURCES",
    "ByteWindowDataset",
    "GlobalBatchSampler",
    "SamplerState",
    "SyntheticDataset",
    "TokenDataset",
    "build_dataset",
    "collate",
    "counted_labels",
    "dataset_for",
    "shard_global_batch",
]


def __getattr__(name: str) -> Any:
    if name in _DATASETS:
        return getattr(importlib.import_module("workers.data.datasets"), name)
    if name in _SAMPLER:
        return getattr(importlib.import_module("workers.data.sampler"), name)
    raise AttributeError(f"module 'workers.data' has no attribute {name!r}")
