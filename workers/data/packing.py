"""``data.packing``: several instruction or chat samples in one ``seq_len`` row.

A masked sample (:class:`~workers.data.datasets.TokenDataset`) is one row padded to
``seq_len + 1`` tokens; most of a row is padding when samples are short. Packing puts
the samples' tokens end to end instead:

- Each sample keeps only its tokens up to its last trained target (what follows is
  padding or template text no label reads).
- Samples go into rows best-fit-decreasing by length (deterministic: it depends on the
  lengths alone, so on the data and never on the world size); a row is then one item
  the sampler walks, and each sample is in exactly one row, so "each sample once per
  epoch" still holds.
- Positions restart at 0 with each sample (the model's RoPE sees every sample as it
  would alone) and the model lets a token attend only to earlier tokens of its own
  sample (a position of 0 starts a new one): ``workers.models.layers.document_mask``. The label of a
  sample's last token (which would predict the next sample's first) is ignored.

So every counted label is predicted from exactly the context it has unpacked, and the
loss (the mean over the global batch's counted labels) is the unpacked loss of the same
samples. The padding at the end of a row is a document of its own, with no label.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from workers.data.datasets import IGNORE_INDEX


class PackedDataset:
    """The samples of a masked dataset packed into rows of ``seq_len + 1`` tokens; item
    ``i`` is ``(tokens, labels, positions)`` of row ``i`` (labels and positions for the
    ``seq_len`` inputs)."""

    packed = True
    masked = True

    def __init__(self, base, *, pad_id: int = 0):
        if not getattr(base, "masked", False):
            raise ValueError("packing needs instruction or chat samples (masked labels)")
        self.base, self.pad_id = base, pad_id
        self.window = base.seq_len + 1
        self.lengths = sample_lengths(base)
        self.rows = pack(self.lengths, self.window)
        self.counts = [sum(base.counted(i) for i in row) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def counted(self, index: int) -> int:
        """Labels the loss counts in row ``index`` (its samples' counted labels)."""
        return self.counts[index]

    def samples(self, index: int) -> list[int]:
        """The base samples in row ``index``, in their order there."""
        return list(self.rows[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``index``: its ``seq_len + 1`` tokens and the ``seq_len`` labels."""
        tokens = torch.full((self.window,), self.pad_id, dtype=torch.long)
        labels = torch.full((self.window - 1,), IGNORE_INDEX, dtype=torch.long)
        at = 0
        for i in self.rows[index]:
            n = self.lengths[i]
            sample_tokens, sample_labels = self.base[i]
            tokens[at : at + n] = sample_tokens[:n]
            # Input t predicts token t + 1: the sample's own labels but for its last token.
            labels[at : at + n - 1] = sample_labels[: n - 1]
            at += n
        return tokens, labels

    def positions(self, index: int) -> torch.Tensor:
        """The ``seq_len`` input positions of row ``index``: 0, 1, ... from each sample's
        start, then from the padding's (one more document, trained on nothing)."""
        spans = [self.lengths[i] for i in self.rows[index]]
        spans.append(self.window - sum(spans))
        return torch.cat([torch.arange(n) for n in spans if n > 0])[: self.window - 1]


def sample_lengths(base) -> list[int]:
    """Tokens each sample needs: up to and including its last trained target (at least 1)."""
    targets = getattr(base, "targets", None)
    if targets is not None:  # a prepared folder: its 0/1 target flags, one row per sample
        flags = np.asarray(targets, dtype=bool).reshape(len(base), -1)
        last = flags.shape[1] - 1 - np.argmax(flags[:, ::-1], axis=1)
        return np.where(flags.any(axis=1), last + 1, 1).astype(int).tolist()
    lengths = []
    for i in range(len(base)):
        _, labels = base[i]
        counted = torch.nonzero(labels != IGNORE_INDEX)
        # labels[t] is token t + 1's: the last target is token last + 1.
        lengths.append(int(counted[-1]) + 2 if len(counted) else 1)
    return lengths


def pack(lengths: list[int], capacity: int) -> list[tuple[int, ...]]:
    """Best-fit decreasing: each sample (longest first, ties by index) into the open row
    with the least room that still fits it, else a new row; rows are ordered by their
    first sample's index and hold their samples in index order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (room left, row number), sorted
    for i in order:
        n = min(lengths[i], capacity)
        at = bisect.bisect_left(room, (n, -1))
        if at < len(room):
            left, row = room.pop(at)
        else:
            left, row = capacity, len(rows)
            rows.append([])
        rows[row].append(i)
        if left - n > 0:
            bisect.insort(room, (left - n, row))
    packed = [tuple(sorted(r)) for r in rows]
    packed.sort(key=lambda r: r[0])
    return packed


def padding_fraction(lengths: list[int], rows: int, capacity: int) -> float:
    """The share of ``rows`` rows of ``capacity`` tokens that is padding."""
    return 1.0 - min(sum(lengths), rows * capacity) / max(rows * capacity, 1)


def collate_positions(dataset, items: list) -> torch.Tensor | None:
    """The positions ``[B, T]`` of ``(epoch, index)`` items of a packed dataset (None for
    any other dataset: positions are then 0..T-1 in every row)."""
    if not getattr(dataset, "packed", False):
        return None
    return torch.stack([dataset.positions(index) for _epoch, index in items])
