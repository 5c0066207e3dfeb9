"""``objective: dpo``: direct preference optimisation (Rafailov et al., 2023; IPO, Azar et
al., 2023) against a frozen reference model.

An item is a pair: samples ``2i`` (prompt + chosen) and ``2i + 1`` (prompt + rejected) of a
``data.shape: preference`` section, whose labels count only the answers' tokens. So a pair
is never split: both answers are in the same micro-batch on the same rank, as chosen rows
then rejected rows (one forward through the trained model, one without gradients through
the reference).

Per pair, with ``logp`` the sum of an answer's token log-probabilities and ``r = logp -
logp_ref`` its log-ratio: ``sigmoid``: ``-log sigmoid(beta (r_c - r_r))``; ``ipo``: ``((r_c
/ n_c - r_r / n_r) - 1 / (2 beta))^2`` with ``n`` the answer's token count (as TRL). The
step's loss is the mean over the global batch's pairs, whatever the world size and
micro-batching (each rank's sum times dp_size / pairs, as masked SFT data). Metrics, means
over the pairs: ``rewards_chosen`` (``beta r_c``), ``rewards_rejected``, ``rewards_margin``
and ``rewards_accuracy`` (the share with ``r_c > r_r``).

The reference is the starting model: with LoRA the same module with its adapters off (no
second copy), else a frozen copy laid out like the trained one; or ``dpo.reference``'s
Hugging Face folder.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from workers.data import IGNORE_INDEX
from workers.data.items import EachItemCountsOnce

METRICS = ("rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy")


class PairDataset(EachItemCountsOnce):
    """Samples ``2i`` and ``2i + 1`` of ``samples`` as item ``i``; each item counts one
    (the loss is a mean over pairs)."""

    def __init__(self, samples):
        if len(samples) % 2 or not getattr(samples, "masked", False):
            raise ValueError("preference data holds a chosen and a rejected sample per row")
        self.samples = samples
        self.seq_len = getattr(samples, "seq_len", None)

    def __len__(self) -> int:
        return len(self.samples) // 2

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"pair {index} is out of range [0, {len(self)})")
        return self.samples[2 * index], self.samples[2 * index + 1]


def rows(spec, dataset) -> PairDataset:
    del spec
    return PairDataset(dataset)


def build(spec, parts: list[nn.Module], *, reference) -> Dpo:
    from workers.spec import DpoSpec

    options = spec.dpo or DpoSpec()
    if spec.model.lora is not None and options.reference_folder is None:
        return Dpo(options, reference=None)  # the trained module, adapters off
    return Dpo(options, reference=reference(options.reference_folder))


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per row: the summed log-probability of its counted labels, in fp32; their count)``."""
    counted = labels != IGNORE_INDEX
    safe = torch.where(counted, labels, 0)
    logps = torch.gather(logits.float().log_softmax(-1), -1, safe.unsqueeze(-1)).squeeze(-1)
    return (logps * counted).sum(-1), counted.sum(-1)


def pair_losses(
    policy: torch.Tensor, ref: torch.Tensor, counts: torch.Tensor, *, beta: float, loss: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(each pair's loss, [its metric sums])`` from chosen-then-rejected rows' summed
    log-probabilities under the trained (``policy``) and reference model, and their
    counted tokens."""
    chosen, rejected = (policy - ref).chunk(2)
    if loss == "ipo":
        n_c, n_r = counts.clamp(min=1).chunk(2)
        per = ((chosen / n_c - rejected / n_r) - 1 / (2 * beta)) ** 2
    else:
        per = -F.logsigmoid(beta * (chosen - rejected))
    with torch.no_grad():
        rc, rr = beta * chosen.double(), beta * rejected.double()
        sums = torch.stack([rc.sum(), rr.sum(), (rc - rr).sum(), (rc > rr).double().sum()])
    return per, sums


class Dpo:
    """DPO / IPO on pairs (:class:`workers.objectives.Objective`)."""

    metric_fields = METRICS
    rows_per_item = 2  # chosen and rejected
    perplexity = False  # exp of a DPO loss means nothing

    def __init__(self, options, *, reference: nn.Module | None):
        self.beta, self.kind = options.beta, options.loss
        self.reference = reference
        self.frozen_parts = {} if reference is None else {"reference": reference}

    def batch(self, dataset, items: list, device: torch.device):
        """``(inputs, labels, pair weights)``: chosen rows, then rejected rows."""
        return self._rows(dataset, items, device, seq_len=None)

    def prepare(self, model: nn.Module, batch):
        """The batch with the reference's summed log-probabilities of each row: before the
        trained model's forward, so nothing runs between that forward and its backward."""
        x, y, weights = batch
        with torch.no_grad(), self._reference_of(model) as ref:
            ref_logps, _ = sequence_logps(ref(x), y)
        if isinstance(ref, FSDPModule) and ref is not model:
            ref.reshard()  # the root stays gathered after a forward
        return x, y, weights, ref_logps

    def forward(self, model: nn.Module, batch):
        """The trained model's logits."""
        return model(batch[0])

    def loss(self, out, batch, *, scale: float | None, n_calls: int):
        del n_calls  # pairs are always counted: scale is dp_size / the global batch's pairs
        logits = out
        _, y, weights, ref_logps = batch
        policy, counts = sequence_logps(logits, y)
        per, sums = pair_losses(policy, ref_logps, counts, beta=self.beta, loss=self.kind)
        loss = (per * weights.to(per.dtype)).sum() * scale
        return loss, loss.detach().double(), sums

    def eval_batch(self, dataset, items: list, *, seq_len: int, device: torch.device):
        """As :meth:`batch`; a None item (padding) is a pair of token-0 rows weighing 0."""
        return self._rows(dataset, items, device, seq_len=seq_len)

    def _rows(self, dataset, items: list, device: torch.device, *, seq_len: int | None):
        pairs = [None if item is None else dataset[item[1]] for item in items]
        width = seq_len or len(pairs[0][0][1])
        blank = (torch.zeros(width + 1, dtype=torch.long), torch.full((width,), IGNORE_INDEX))
        rows = [blank if p is None else p[0] for p in pairs]
        rows += [blank if p is None else p[1] for p in pairs]
        x = torch.stack([tokens[:-1] for tokens, _ in rows]).to(device, non_blocking=True)
        y = torch.stack([labels for _, labels in rows]).to(device, non_blocking=True)
        weights = torch.tensor([float(p is not None) for p in pairs], dtype=torch.float64)
        return x, y, weights.to(device)

    def eval_sum(self, model: nn.Module, batch) -> torch.Tensor:
        _, y, weights, ref_logps = self.prepare(model, batch)
        logits = self.forward(model, batch)
        policy, counts = sequence_logps(logits, y)
        per, _ = pair_losses(policy, ref_logps, counts, beta=self.beta, loss=self.kind)
        return (per.double() * weights).sum()

    @contextlib.contextmanager
    def _reference_of(self, model: nn.Module):
        """The module that computes the reference: the frozen copy, or ``model`` with its
        LoRA adapters off (DDP unwrapped: nothing of it is synchronised)."""
        if self.reference is not None:
            yield self.reference
            return
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        with adapters_off(inner):
            yield inner


@contextlib.contextmanager
def adapters_off(model: nn.Module):
    """``model``'s LoRA layers compute their base layer only, then their adapters again.

    peft's flag that its layers' forward reads is set directly: peft's ``enable_adapters``
    would also flip the adapters' ``requires_grad``, and FSDP2 makes a parameter's gathered
    copy once, with the flag it has then, so a first gather while it is off would leave the
    adapters untrained."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield model
    finally:
        for layer in layers:
            layer._disable_adapters = False
