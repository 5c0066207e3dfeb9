"""``data.sources``: several training sources mixed by weight.

:class:`MixedDataset` puts the sources' samples one after the other (source ``k``'s
sample ``i`` is item ``offsets[k] + i``). :class:`MixtureSampler` draws each slot of a
global batch from one source, chosen by a smooth weighted round robin: every source
earns its weight in credit per slot, the richest is drawn and pays the whole. That is
deterministic, and after any number of slots each source has been drawn within one
sample of its share. Each source walks its own seeded epochs
(:class:`~workers.data.sampler.GlobalBatchSampler`), so every sample of a source is seen
once per that source's epoch. The global batch is drawn before it is split between
ranks, and the whole state (each source's cursor, the credits) is a checkpoint's, so a
job resumed at another world size draws exactly what it would have drawn.

A mixture of masked (instruction, chat) and unmasked (text) sources is masked: a text
sample's every label is counted, so the loss stays the mean over the global batch's
counted labels.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from workers.data.sampler import GlobalBatchSampler

# Mixed into the seed so each source's epochs follow an order of their own.
_SOURCE_STRIDE = 7727


class MixedDataset:
    """The sources' samples one after the other; ``weights`` are their shares."""

    def __init__(self, datasets: list, weights: list[float]):
        if len(datasets) != len(weights) or not datasets:
            raise ValueError("a mixture needs one weight per source")
        self.datasets, self.weights = list(datasets), [float(w) for w in weights]
        self.sizes = [len(d) for d in datasets]
        self.offsets = [0, *accumulate(self.sizes)][:-1]
        self.masked = any(getattr(d, "masked", False) for d in datasets)
        self.seq_len = getattr(datasets[0], "seq_len", None)

    def __len__(self) -> int:
        return sum(self.sizes)

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, sample)`` of item ``index``."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {index} out of range for {len(self)} samples")
        k = max(k for k, offset in enumerate(self.offsets) if offset <= index)
        return k, index - self.offsets[k]

    def __getitem__(self, index: int):
        k, i = self.locate(index)
        item = self.datasets[k][i]
        if self.masked and not isinstance(item, tuple):  # a text sample: every label counts
            return item, item[1:].clone()
        return item

    def counted(self, index: int) -> int:
        """Labels the loss counts in item ``index`` (a text sample's: all of them)."""
        k, i = self.locate(index)
        source = self.datasets[k]
        if getattr(source, "masked", False):
            return source.counted(i)
        return source.seq_len  # every label of a text sample: nothing to read


class MixtureSampler:
    """Global batches drawn from the sources of a :class:`MixedDataset` by weight; the
    interface of :class:`~workers.data.sampler.GlobalBatchSampler`."""

    def __init__(self, sizes: list[int], weights: list[float], *, seed: int):
        total = sum(weights)
        self.shares = [w / total for w in weights]
        self.offsets = [0, *accumulate(sizes)][:-1]
        self.sources = [
            GlobalBatchSampler(n, seed=seed * _SOURCE_STRIDE + k) for k, n in enumerate(sizes)
        ]
        self.credit = [0.0] * len(sizes)
        self.num_samples = sum(sizes)

    def _pick(self) -> int:
        for k, share in enumerate(self.shares):
            self.credit[k] += share
        k = max(range(len(self.credit)), key=lambda j: (self.credit[j], -j))
        self.credit[k] -= 1.0
        return k

    def next_global_batch(self, global_batch_size: int) -> list[tuple[int, int]]:
        """The next ``global_batch_size`` ``(epoch of its source, item)`` pairs."""
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        batch = []
        for _ in range(global_batch_size):
            k = self._pick()
            ((epoch, i),) = self.sources[k].next_global_batch(1)
            batch.append((epoch, self.offsets[k] + i))
        return batch

    def state_dict(self) -> dict:
        """Every source's cursor and the credits (JSON-serialisable); ``epoch`` and
        ``position`` are the first source's (what a step's metrics report)."""
        cursors = [s.state_dict() for s in self.sources]
        return {**cursors[0], "sources": cursors, "credit": list(self.credit)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved."""
        cursors, credit = state.get("sources"), state.get("credit")
        if not isinstance(cursors, list) or len(cursors) != len(self.sources):
            raise ValueError(
                f"sampler state has no cursor per source ({len(self.sources)} sources); was "
                "the checkpoint written for another data.sources?"
            )
        for sampler, cursor in zip(self.sources, cursors, strict=True):
            sampler.load_state_dict(cursor)
        self.credit = [float(c) for c in credit]


def sampler_for(dataset, *, seed: int):
    """The sampler a dataset is walked with: by weight for a mixture, else one cursor."""
    if isinstance(dataset, MixedDataset):
        return MixtureSampler(dataset.sizes, dataset.weights, seed=seed)
    return GlobalBatchSampler(len(dataset), seed=seed)


def source_of(dataset, items: list) -> torch.Tensor:
    """The source of each ``(epoch, item)`` of a mixture (for tests and reports)."""
    return torch.tensor([dataset.locate(i)[0] for _epoch, i in items])
