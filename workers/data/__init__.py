"""Datasets and the world-size independent, resumable global-batch sampler."""

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
