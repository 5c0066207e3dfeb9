"""Resumable global-batch sampling that does not depend on the world size.

One cursor, ``(epoch, position)`` into that epoch's seeded permutation, walks
the whole dataset. Each step takes the next global batch from it, and every
data-parallel rank then takes its contiguous slice of that batch. Because the
cursor knows nothing about ranks, a job can resume with a different number of
workers and still see every sample of every epoch exactly once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import torch

# Large prime mixing seed and epoch into one generator seed.
_EPOCH_STRIDE = 1000003


@dataclass
class SamplerState:
    """Cursor of a :class:`GlobalBatchSampler`: the epoch and the position within its
    permutation."""

    epoch: int = 0
    position: int = 0


class GlobalBatchSampler:
    """Yields global batches of ``(epoch, sample_index)`` pairs from seeded per-epoch
    permutations."""

    def __init__(self, num_samples: int, *, seed: int, state: SamplerState | None = None) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.num_samples = num_samples
        self.seed = seed
        self.state = SamplerState()
        self._perm_epoch: int | None = None
        self._perm: list[int] = []
        if state is not None:
            self.load_state_dict(asdict(state))

    def permutation(self, epoch: int) -> list[int]:
        """Sample order of ``epoch``; the current epoch's order is cached."""
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed * _EPOCH_STRIDE + epoch)
            self._perm = torch.randperm(self.num_samples, generator=gen).tolist()
            self._perm_epoch = epoch
        return self._perm

    def next_global_batch(self, global_batch_size: int) -> list[tuple[int, int]]:
        """Return the next ``global_batch_size`` ``(epoch, index)`` pairs and advance the cursor.

        A batch that reaches the end of an epoch continues with the start of the
        next epoch's permutation, so batches always have the full size.
        """
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        batch: list[tuple[int, int]] = []
        while len(batch) < global_batch_size:
            epoch, pos = self.state.epoch, self.state.position
            take = min(global_batch_size - len(batch), self.num_samples - pos)
            batch.extend((epoch, i) for i in self.permutation(epoch)[pos : pos + take])
            pos += take
            if pos == self.num_samples:
                self.state = SamplerState(epoch=epoch + 1, position=0)
            else:
                self.state = SamplerState(epoch=epoch, position=pos)
        return batch

    def state_dict(self) -> dict[str, int]:
        """The cursor as plain ints (JSON-serialisable, for checkpoints)."""
        return {"epoch": int(self.state.epoch), "position": int(self.state.position)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the cursor saved by :meth:`state_dict`."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_samples:
            raise ValueError(
                f"sampler state (epoch={epoch}, position={position}) is invalid for "
                f"{self.num_samples} samples; was the checkpoint written for another dataset?"
            )
        self.state = SamplerState(epoch=epoch, position=position)


def shard_global_batch(
    batch: list, *, dp_rank: int, dp_size: int, micro_batch_size: int
) -> list[list]:
    """This rank's contiguous slice of ``batch``, split into micro-batches of ``micro_batch_size``.

    Concatenating the result over ranks ``0..dp_size-1`` (and their micro-batches)
    gives ``batch`` back in order.
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(
            f"dp_rank ({dp_rank}) must be in [0, dp_size) with dp_size ({dp_size}) >= 1"
        )
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if len(batch) % dp_size:
        raise ValueError(
            f"global batch size ({len(batch)}) must be divisible by the data-parallel size "
            f"({dp_size})"
        )
    per_rank = len(batch) // dp_size
    if per_rank % micro_batch_size:
        raise ValueError(
            f"per-rank batch size ({per_rank}) must be divisible by micro_batch_size "
            f"({micro_batch_size})"
        )
    local = batch[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    return [local[i : i + micro_batch_size] for i in range(0, per_rank, micro_batch_size)]


class _Indexable(Protocol):
    def __getitem__(self, index: int) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def collate(dataset: _Indexable, items: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the samples of ``(epoch, index)`` items into ``(inputs, targets)``, each ``[B, T]``.

    For a dataset whose items are ``(tokens, labels)`` the targets are the labels
    (-100 where the loss ignores a position).
    """
    if not items:
        raise ValueError("collate needs at least one item")
    samples = [dataset[index] for _epoch, index in items]
    if isinstance(samples[0], tuple):
        tokens = torch.stack([t for t, _ in samples])
        return tokens[:, :-1].contiguous(), torch.stack([lab for _, lab in samples])
    stacked = torch.stack(samples)
    return stacked[:, :-1].contiguous(), stacked[:, 1:].contiguous()


def counted_labels(dataset, items: list[tuple[int, int]]) -> int | None:
    """Labels the loss counts over ``items``, or None when the dataset counts every position.

    Every rank knows the whole global batch, so each can compute the global
    count without communication.
    """
    if not getattr(dataset, "masked", False):
        return None
    return sum(dataset.counted(index) for _epoch, index in items)
