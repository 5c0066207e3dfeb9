"""Datasets whose loss is a mean over items (a DPO pair, an image with its caption), not over
token labels: :func:`workers.data.sampler.counted_labels` then counts the global batch's
items, so a step is the same mean on any world size and micro-batching."""

from __future__ import annotations


class EachItemCountsOnce:
    """Mixin of such a dataset: it is ``masked`` (its counts decide the loss's scale) and
    every item counts one."""

    masked = True

    def counted(self, index: int) -> int:
        del index
        return 1
