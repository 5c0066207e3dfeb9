"""``objective: causal_lm``: next-token cross entropy. An item is one sample (a text window,
or an instruction / chat sample whose labels are -100 where nothing is trained); the loss
is the token mean, or, for masked data, the mean over the global batch's counted labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workers.data import IGNORE_INDEX, collate
from workers.data.eval_set import collate_eval
from workers.data.packing import collate_positions


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Token-mean cross entropy in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def masked_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy in fp32 summed over the positions whose target is not -100."""
    return F.cross_entropy(
        logits.float().flatten(0, 1),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def rows(spec, dataset):
    """Every sample is an item."""
    del spec
    return dataset


def build(spec, parts, *, reference) -> CausalLM:
    """Nothing beside the model."""
    del spec, parts, reference
    return CausalLM()


class CausalLM:
    """Next-token cross entropy (:class:`workers.objectives.Objective`)."""

    metric_fields: tuple[str, ...] = ()
    rows_per_item = 1
    frozen_parts: dict = {}  # noqa: RUF012 (never written)
    perplexity = True

    def batch(self, dataset, items: list, device: torch.device):
        """``(inputs, targets, positions or None)``: positions restart per document in
        packed rows."""
        x, y = (t.to(device, non_blocking=True) for t in collate(dataset, items))
        positions = collate_positions(dataset, items)
        return x, y, None if positions is None else positions.to(device)

    def prepare(self, model, batch):
        del model
        return batch

    def forward(self, model, batch):
        x, _, positions = batch
        return model(x) if positions is None else model(x, positions=positions)

    def loss(self, out, batch, *, scale: float | None, n_calls: int):
        y = batch[1]
        if scale is not None:
            loss = masked_loss_sum(out, y) * scale
            return loss, loss.detach().double(), None
        loss = loss_fn(out, y)
        return loss / n_calls, loss.detach().double() / n_calls, None

    def eval_batch(self, dataset, items: list, *, seq_len: int, device: torch.device):
        x, y = (t.to(device) for t in collate_eval(dataset, items, seq_len=seq_len))
        return x, y, None

    def eval_sum(self, model, batch) -> torch.Tensor:
        x, y, _ = batch
        return masked_loss_sum(model(x), y).double()
