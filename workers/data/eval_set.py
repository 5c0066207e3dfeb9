"""A held-out evaluation set: the same samples in the same order at every evaluation, for
any world size, before and after a resize or a resume.

- :func:`holdout` splits a dataset's sample indices into training and evaluation ones,
  seeded (its own random stream: the split does not follow the epochs' permutations).
- :class:`IndexView` is a dataset restricted to some of its indices (the training side
  of a split, which the sampler then walks; the evaluation side).
- :func:`eval_items` lists the evaluation samples in order, padded to a whole number of
  calls per data-parallel rank, so every rank runs the same number of forwards (FSDP's
  gathers, DDP's broadcasts and a pipeline's fixed shapes need that); :func:`collate_eval`
  makes a padding row a row the loss does not count (every label -100).
- :func:`eval_count` is what the summed loss is divided by: the counted labels of the
  real samples, which every rank computes alone; so the evaluation loss is the mean over
  the whole set's counted tokens whatever the world size.
"""

from __future__ import annotations

import torch

from workers.data.datasets import IGNORE_INDEX
from workers.data.sampler import collate

# Mixed into the seed so the split is not the first epoch's permutation.
_SPLIT_SALT = 7919


def holdout(num_samples: int, fraction: float, *, seed: int) -> tuple[list[int], list[int]]:
    """``(training, evaluation)`` sample indices, each sorted: ``round(num_samples *
    fraction)`` (at least one) held out at random, seeded, and at least one left to train
    on."""
    if num_samples < 2:
        raise ValueError(f"holding out needs at least 2 samples, got {num_samples}")
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n_eval = min(max(1, round(num_samples * fraction)), num_samples - 1)
    gen = torch.Generator().manual_seed(seed * _SPLIT_SALT + 1)
    order = torch.randperm(num_samples, generator=gen).tolist()
    held = set(order[:n_eval])
    train = [i for i in range(num_samples) if i not in held]
    return train, sorted(held)


class IndexView:
    """``dataset`` seen through ``indices``: item ``i`` is ``dataset[indices[i]]``; masked
    datasets keep their label counts."""

    def __init__(self, dataset, indices: list[int]):
        if not indices:
            raise ValueError("an index view needs at least one index")
        self.dataset, self.indices = dataset, list(indices)
        self.masked = getattr(dataset, "masked", False)
        self.seq_len = getattr(dataset, "seq_len", None)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int):
        return self.dataset[self.indices[index]]

    def counted(self, index: int) -> int:
        """Labels the loss counts in item ``index`` (masked datasets only)."""
        return self.dataset.counted(self.indices[index])


def eval_items(num_samples: int, *, dp_size: int, per_call: int) -> list[tuple[int, int] | None]:
    """Every evaluation sample as a sampler item ``(0, index)``, in order, then None (a
    padding row) up to a multiple of ``dp_size * per_call``."""
    if num_samples < 1 or dp_size < 1 or per_call < 1:
        raise ValueError("eval_items needs num_samples, dp_size and per_call >= 1")
    items: list[tuple[int, int] | None] = [(0, i) for i in range(num_samples)]
    whole = dp_size * per_call
    return items + [None] * (-num_samples % whole)


def collate_eval(
    dataset, items: list[tuple[int, int] | None], *, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~workers.data.sampler.collate` where a None item becomes a row of token 0
    whose every label is ignored."""
    real = [item for item in items if item is not None]
    if real:
        x, y = collate(dataset, real)
    else:
        x = torch.zeros((0, seq_len), dtype=torch.long)
        y = torch.zeros((0, seq_len), dtype=torch.long)
    pad = len(items) - len(real)
    if not pad:
        return x, y
    # Padding only ever follows the real items (eval_items), so order is kept.
    x_pad = torch.zeros((pad, x.shape[1] if real else seq_len), dtype=x.dtype)
    y_pad = torch.full((pad, y.shape[1] if real else seq_len), IGNORE_INDEX, dtype=y.dtype)
    return torch.cat([x, x_pad]), torch.cat([y, y_pad])


def eval_count(dataset, num_samples: int, *, seq_len: int) -> int:
    """The labels the loss counts over the first ``num_samples`` samples of ``dataset``."""
    if getattr(dataset, "masked", False):
        return sum(dataset.counted(i) for i in range(num_samples))
    return num_samples * seq_len
