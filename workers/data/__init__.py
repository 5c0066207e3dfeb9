"""Datasets and the world-size independent, resumable global-batch sampler."""

from workers.data.datasets import SOURCES, ByteWindowDataset, SyntheticDataset, build_dataset
from workers.data.sampler import GlobalBatchSampler, SamplerState, collate, shard_global_batch

__all__ = [
    "SOURCES",
    "ByteWindowDataset",
    "GlobalBatchSampler",
    "SamplerState",
    "SyntheticDataset",
    "build_dataset",
    "collate",
    "shard_global_batch",
]
