"""Held-out evaluation in the training loop: which samples, at which steps, what is reported.

The evaluation set is fixed by the spec alone, never by the world size:

- ``data.eval_fraction`` holds out a seeded share of the training samples
  (:func:`workers.data.eval_set.holdout`); the loop trains on the rest only.
- With ``data.sources``, each source may hold out its own ``eval_fraction``; the
  evaluation set is every source's held-out samples.
- ``data.eval`` is a source of its own, read like ``data``. A synthetic one draws the
  samples that follow the training ones from the same seeded chain (the same
  distribution, no sample shared).
- ``train.eval_samples`` keeps the first that many, in order.

Every ``train.eval_every_steps`` steps and after the last one, every rank evaluates its
share (:meth:`workers.stepper.Stepper.evaluate`); the loss is the mean over the set's
counted tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.data.eval_set import IndexView, eval_count, eval_items, holdout
from workers.data.mixture import MixedDataset
from workers.spec import DataSource, EarlyStoppingSpec, JobSpec

# (section) -> its dataset; the loop's reader of data sections.
DatasetOf = Callable[[DataSource], Any]


class EarlyStopping:
    """Counts evaluations without an improvement (an eval_loss below the best so far by more
    than ``min_delta``); every rank sees the same all-reduced losses, so all decide alike.
    Its state travels in the checkpoint's manifest, so a resumed job counts on from there."""

    def __init__(self, spec: EarlyStoppingSpec):
        self.patience, self.min_delta = spec.patience, spec.min_delta
        self.best: float | None = None
        self.bad = 0

    def update(self, loss: float) -> bool:
        """Count the evaluation ``loss``; whether the job stops now."""
        if self.best is None or loss < self.best - self.min_delta:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
        return self.bad >= self.patience

    def state_dict(self) -> dict:
        """What a checkpoint keeps."""
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state: dict) -> None:
        """Go on from a checkpoint's state."""
        self.best, self.bad = state.get("best"), int(state.get("bad", 0))


@dataclass
class Evaluation:
    """The job's evaluation set, when it is evaluated, and whether the job stops early."""

    dataset: Any
    size: int  # samples evaluated each time (the first ``size`` of ``dataset``)
    count: int  # the labels the loss counts over them
    every: int | None
    last_step: int
    seq_len: int
    stopping: EarlyStopping | None = None

    def restore(self, extra: dict | None) -> None:
        """Take up the early-stopping count a checkpoint's manifest ``extra`` kept."""
        if self.stopping is not None and extra and "early_stopping" in extra:
            self.stopping.load_state_dict(extra["early_stopping"])

    def manifest(self, evaluated: dict) -> dict:
        """What a checkpoint of this step keeps: its held-out loss (what ``keep_best`` ranks
        by) and the early-stopping count."""
        out = {"eval_loss": evaluated["eval_loss"]} if evaluated else {}
        if self.stopping is not None:
            out["early_stopping"] = self.stopping.state_dict()
        return out

    def due(self, step: int) -> bool:
        """Whether the loop evaluates after ``step``."""
        return step == self.last_step or (self.every is not None and step % self.every == 0)

    def run(self, stepper) -> dict[str, float | int]:
        """Evaluate on every rank (a collective); the metric fields of the result."""
        t0 = time.perf_counter()
        items = eval_items(self.size, dp_size=stepper.coords.dp_size, per_call=stepper.per_call)
        loss = stepper.evaluate(self.dataset, items, count=self.count, seq_len=self.seq_len)
        fields: dict[str, float | int] = {"eval_loss": loss}
        # Perplexity is the exp of a token cross entropy (not of a DPO loss, say); exp
        # overflows a float past about 709.
        if stepper.objective.perplexity and loss < 700:
            fields["eval_perplexity"] = math.exp(loss)
        fields["eval_s"] = time.perf_counter() - t0
        fields["eval_samples"] = self.size
        return fields


def _held_out_of_sources(spec: JobSpec, mixture: MixedDataset) -> tuple[MixedDataset, MixedDataset]:
    """``(the mixture without its held-out samples, those samples)``: each source with an
    eval_fraction holds out its own share, seeded by its place; the evaluation set is
    them all, one source after the other."""
    train, held = [], []
    for k, (source, part) in enumerate(zip(spec.data.sources, mixture.datasets, strict=True)):
        if source.eval_fraction is None:
            train.append(part)
            continue
        kept, out = holdout(len(part), source.eval_fraction, seed=spec.train.seed + 1 + k)
        train.append(IndexView(part, kept))
        held.append(IndexView(part, out))
    return MixedDataset(train, mixture.weights), MixedDataset(held, [1.0] * len(held))


def split_for_eval(spec: JobSpec, dataset, dataset_of: DatasetOf) -> tuple[Any, Evaluation | None]:
    """``(training dataset, evaluation)``: the samples the sampler walks (all of ``dataset``
    unless some are held out) and the evaluation, None when the spec has no evaluation set."""
    data = spec.data
    if data.sources is not None and any(src.eval_fraction for src in data.sources):
        dataset, held = _held_out_of_sources(spec, dataset)
    elif data.eval_fraction is not None:
        train_idx, eval_idx = holdout(len(dataset), data.eval_fraction, seed=spec.train.seed)
        dataset, held = IndexView(dataset, train_idx), IndexView(dataset, eval_idx)
    elif data.eval is not None and data.eval.source == "synthetic" and data.sources is None:
        # The samples after the training ones, from the same seeded chain.
        n, extra = data.num_samples, data.eval.num_samples
        longer = dataset_of(data.model_copy(update={"num_samples": n + extra}))
        held = IndexView(longer, list(range(n, n + extra)))
    elif data.eval is not None:
        held = dataset_of(data.eval)
    else:
        return dataset, None
    size = min(len(held), spec.train.eval_samples or len(held))
    if size < 1:
        raise ValueError("data.eval holds no samples: give it a file with at least one sample")
    evaluation = Evaluation(
        dataset=held,
        size=size,
        count=eval_count(held, size, seq_len=data.seq_len),
        every=spec.train.eval_every_steps,
        last_step=spec.train.steps,
        seq_len=data.seq_len,
        stopping=EarlyStopping(spec.train.early_stopping) if spec.train.early_stopping else None,
    )
    return dataset, evaluation
