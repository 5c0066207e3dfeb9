"""The held-out evaluation set (workers.data.eval_set): a seeded split, the same items in the
same order for any world size, padding rows that count for nothing."""

from __future__ import annotations

import pytest
import torch

from workers.data import IGNORE_INDEX, GlobalBatchSampler, SyntheticDataset, shard_global_batch
from workers.data.eval_set import IndexView, collate_eval, eval_count, eval_items, holdout
from workers.stepper import masked_loss_sum

SEQ = 8


def synthetic(n: int = 40) -> SyntheticDataset:
    return SyntheticDataset(seq_len=SEQ, num_samples=n, vocab_size=32, seed=3)


class Masked:
    """A masked dataset's interface (``masked``, ``counted``, ``(tokens, labels)`` items):
    sample i counts its last i % 4 + 1 labels."""

    masked = True

    def __len__(self) -> int:
        return 10

    def counted(self, index: int) -> int:
        return index % 4 + 1

    def __getitem__(self, index: int):
        tokens = torch.arange(SEQ + 1) + index
        labels = torch.full((SEQ,), IGNORE_INDEX)
        labels[SEQ - self.counted(index) :] = tokens[1:][SEQ - self.counted(index) :]
        return tokens, labels


def test_the_split_is_seeded_disjoint_and_whole():
    train, held = holdout(40, 0.1, seed=7)
    assert (train, held) == holdout(40, 0.1, seed=7)
    assert holdout(40, 0.1, seed=8) != (train, held)
    assert len(held) == 4 and set(train).isdisjoint(held)
    assert sorted(train + held) == list(range(40)) and held == sorted(held)
    # Not the first epoch's order: the split draws from its own stream.
    first_epoch = GlobalBatchSampler(40, seed=7).permutation(0)
    assert set(held) != set(first_epoch[:4])


@pytest.mark.parametrize(
    ("n", "fraction", "held"), [(2, 0.01, 1), (3, 0.99, 2), (1000, 0.001, 1), (10, 0.5, 5)]
)
def test_at_least_one_sample_each_side(n, fraction, held):
    train, eval_ = holdout(n, fraction, seed=0)
    assert len(eval_) == held and len(train) == n - held


@pytest.mark.parametrize(("n", "fraction"), [(1, 0.5), (10, 0.0), (10, 1.0), (10, -0.1)])
def test_a_split_that_cannot_be_made_is_refused(n, fraction):
    with pytest.raises(ValueError):
        holdout(n, fraction, seed=0)


def test_a_view_reads_through_its_indices_and_keeps_label_counts():
    data = synthetic()
    view = IndexView(data, [5, 2, 9])
    assert len(view) == 3 and not view.masked
    assert torch.equal(view[1], data[2])
    masked = IndexView(Masked(), [3, 6])
    assert masked.masked and [masked.counted(0), masked.counted(1)] == [4, 3]
    with pytest.raises(ValueError):
        IndexView(data, [])


@pytest.mark.parametrize(("dp", "per_call"), [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_every_rank_runs_as_many_calls_and_the_items_stay_in_order(dp, per_call):
    items = eval_items(7, dp_size=dp, per_call=per_call)
    assert len(items) % (dp * per_call) == 0
    assert [i for i in items if i is not None] == [(0, i) for i in range(7)]
    calls = [
        shard_global_batch(items, dp_rank=r, dp_size=dp, micro_batch_size=per_call)
        for r in range(dp)
    ]
    assert len({len(c) for c in calls}) == 1  # the same number of forwards on every rank
    assert [i for c in calls for call in c for i in call] == items


@pytest.mark.parametrize("dp", [1, 2, 3, 5])
def test_the_summed_loss_over_ranks_is_the_same_for_any_world_size(dp):
    """Padding rows add nothing: the set's loss sum is the same however it is sharded."""
    torch.manual_seed(0)
    data = IndexView(synthetic(), [1, 4, 6, 9, 13, 17, 22])
    logits_of = torch.nn.Embedding(32, 32)  # any fixed function of the tokens
    items = eval_items(len(data), dp_size=dp, per_call=2)
    total = torch.zeros((), dtype=torch.float64)
    for rank in range(dp):
        for call in shard_global_batch(items, dp_rank=rank, dp_size=dp, micro_batch_size=2):
            x, y = collate_eval(data, call, seq_len=SEQ)
            assert x.shape == y.shape == (2, SEQ)
            total += masked_loss_sum(logits_of(x), y).double()
    x, y = collate_eval(data, [(0, i) for i in range(len(data))], seq_len=SEQ)
    reference = masked_loss_sum(logits_of(x), y).double()
    assert float(total) == pytest.approx(float(reference), rel=1e-12)
    assert eval_count(data, len(data), seq_len=SEQ) == 7 * SEQ


def test_a_rank_with_only_padding_gets_rows_that_count_nothing():
    x, y = collate_eval(synthetic(), [None, None], seq_len=SEQ)
    assert x.shape == y.shape == (2, SEQ) and x.dtype == torch.long
    assert (y == IGNORE_INDEX).all()


def test_masked_samples_count_only_their_labels():
    data = Masked()
    assert eval_count(data, 5, seq_len=SEQ) == 1 + 2 + 3 + 4 + 1
    x, y = collate_eval(data, [(0, 2), None], seq_len=SEQ)
    assert x.shape == (2, SEQ)
    assert int((y != IGNORE_INDEX).sum()) == 3
