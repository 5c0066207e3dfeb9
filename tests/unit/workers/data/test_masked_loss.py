"""The loss on masked data counts only completion tokens, averaged over the global batch."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.workers.data.conftest import INSTRUCTIONS
from tests.unit.workers.data.test_samples import prep
from workers.data import GlobalBatchSampler, collate
from workers.models.config import ModelConfig
from workers.models.llama import build_model
from workers.stepper import Stepper, loss_fn, masked_loss_sum
from workers.strategies.mesh import Coordinates

CFG = ModelConfig(
    vocab_size=512, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64
)


@pytest.fixture
def dataset(tmp_path, bpe_tokenizer):
    return prep(tmp_path, bpe_tokenizer[0], INSTRUCTIONS * 2, shape="instruction", seq_len=32)


def stepper(model, dataset, micro_batch_size: int) -> Stepper:
    return Stepper(
        parts=[model],
        optimizers=[torch.optim.SGD(model.parameters(), lr=0.5)],
        dataset=dataset,
        coords=Coordinates(),
        device=torch.device("cpu"),
        micro_batch_size=micro_batch_size,
        microbatches=1,
        precision="fp32",
        grad_clip=0.0,
    )


def manual_completion_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean of -log p(label) over the positions whose label is not -100, by hand."""
    keep = labels != -100
    logp = logits.log_softmax(-1)
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -picked[keep].mean()


def test_loss_counts_completion_tokens_only(dataset):
    model = build_model(CFG, seed=0)
    batch = GlobalBatchSampler(len(dataset), seed=0).next_global_batch(8)
    x, y = collate(dataset, batch)
    with torch.no_grad():
        logits = model(x)
    expected = manual_completion_ce(logits, y)
    loss, _ = stepper(model, dataset, micro_batch_size=8).step(batch)
    assert loss == pytest.approx(float(expected), rel=1e-6)
    # Counting the prompt (and padding) positions gives another number: the test can fail.
    tokens = torch.stack([dataset[i][0] for _, i in batch])
    assert abs(float(loss_fn(logits, tokens[:, 1:])) - loss) > 1e-2
    # Whatever the model predicts at prompt positions, the loss does not move.
    prompt = y == -100
    noisy = logits.clone()
    noisy[prompt] = torch.randn_like(noisy[prompt]) * 10
    assert float(masked_loss_sum(noisy, y)) == pytest.approx(float(masked_loss_sum(logits, y)))


def test_micro_batch_split_does_not_change_the_step(dataset):
    # Samples hold different numbers of completion tokens, so a mean of per-micro-batch
    # means would differ from the global token mean: the step must not.
    counts = {dataset.counted(i) for i in range(len(dataset))}
    assert len(counts) > 1
    batch = GlobalBatchSampler(len(dataset), seed=1).next_global_batch(8)
    whole, split = build_model(CFG, seed=0), build_model(CFG, seed=0)
    before = copy.deepcopy(whole.state_dict())
    loss_whole, _ = stepper(whole, dataset, micro_batch_size=8).step(batch)
    loss_split, _ = stepper(split, dataset, micro_batch_size=1).step(batch)
    assert loss_split == pytest.approx(loss_whole, rel=1e-6)
    for name, p in whole.state_dict().items():
        assert not torch.equal(p, before[name]) or "norm" in name
        torch.testing.assert_close(split.state_dict()[name], p, rtol=1e-5, atol=1e-6)


def test_evaluate_is_the_token_mean_over_the_whole_set_and_changes_nothing(dataset):
    """Stepper.evaluate: the mean over every counted label of the set (padding rows count
    nothing), the same for any call size; no gradient, no change to the weights, the
    model's mode restored."""
    from workers.data.eval_set import eval_count, eval_items

    model = build_model(CFG, seed=0)
    before = copy.deepcopy(model.state_dict())
    n = len(dataset)
    x, y = collate(dataset, [(0, i) for i in range(n)])
    with torch.no_grad():
        expected = float(manual_completion_ce(model(x), y))
    count = eval_count(dataset, n, seq_len=32)
    got = [
        stepper(model, dataset, micro_batch_size=m).evaluate(
            dataset, eval_items(n, dp_size=1, per_call=m), count=count, seq_len=32
        )
        for m in (1, 3)  # 3: the last call is one sample and two padding rows
    ]
    assert got[0] == pytest.approx(expected, rel=1e-6)
    assert got[1] == pytest.approx(got[0], rel=1e-6)  # fp32 sums differ per batch shape
    assert model.training and all(p.grad is None for p in model.parameters())
    for name, p in model.state_dict().items():
        assert torch.equal(p, before[name])
