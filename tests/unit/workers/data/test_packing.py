"""data.packing: rows of several masked samples, positions restarting per sample, and the
attention mask that keeps samples apart."""

from __future__ import annotations

import random

import pytest
import torch

from tests.unit.workers.data.test_samples import prep
from workers.data.datasets import IGNORE_INDEX
from workers.data.packing import PackedDataset, pack, padding_fraction, sample_lengths
from workers.models.layers import document_mask

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "again",
    "and",
    "again",
]


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "prompt": " ".join(rng.choices(WORDS, k=rng.randint(1, 6))),
            "completion": " ".join(rng.choices(WORDS, k=rng.randint(1, 10))),
        }
        for _ in range(n)
    ]


def test_best_fit_decreasing_puts_every_sample_in_one_row_within_capacity():
    rng = random.Random(1)
    lengths = [rng.randint(1, 33) for _ in range(200)]
    rows = pack(lengths, 33)
    flat = sorted(i for row in rows for i in row)
    assert flat == list(range(200))
    assert all(sum(lengths[i] for i in row) <= 33 for row in rows)
    assert rows == pack(lengths, 33)  # the lengths alone decide
    assert len(rows) < 200 and padding_fraction(lengths, len(rows), 33) < 0.1
    assert padding_fraction(lengths, 200, 33) > 0.4  # one per row, as without packing


def test_a_packed_row_holds_each_sample_as_it_was_with_positions_from_zero(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    base = prep(tmp_path, folder, _rows(24), shape="instruction", seq_len=48)
    packed = PackedDataset(base)
    assert len(packed) < len(base) and sorted(i for r in packed.rows for i in r) == list(range(24))
    lengths = sample_lengths(base)
    for row in range(len(packed)):
        tokens, labels = packed[row]
        positions = packed.positions(row)
        assert tokens.shape == (49,) and labels.shape == positions.shape == (48,)
        at = 0
        for i in packed.samples(row):
            n = lengths[i]
            want_tokens, want_labels = base[i]
            assert torch.equal(tokens[at : at + n], want_tokens[:n])
            assert torch.equal(labels[at : at + n - 1], want_labels[: n - 1])
            # Nothing beyond the sample's length is trained on, so nothing is lost.
            assert (want_labels[n - 1 :] == IGNORE_INDEX).all()
            assert torch.equal(positions[at : at + n], torch.arange(n)[: 48 - at])
            at += n
        assert (labels[at:] == IGNORE_INDEX).all()
        assert packed.counted(row) == int((labels != IGNORE_INDEX).sum())
        assert packed.counted(row) == sum(base.counted(i) for i in packed.samples(row))


def test_the_mask_lets_a_token_see_only_earlier_tokens_of_its_own_document():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    mask = document_mask(positions)[0, 0]
    docs = [0, 0, 0, 1, 1, 2]
    for q in range(6):
        for k in range(6):
            assert bool(mask[q, k]) == (k <= q and docs[k] == docs[q]), (q, k)


def _model():
    from workers.models.config import get_model_config
    from workers.models.llama import build_model

    return build_model(get_model_config("gpt-tiny"), seed=0).eval()


def test_a_document_never_sees_another_bit_for_bit():
    """Perturbing document 1 of a packed row leaves document 2's logits unchanged exactly."""
    model = _model()
    gen = torch.Generator().manual_seed(0)
    row = torch.randint(0, 256, (1, 32), generator=gen)
    positions = torch.cat([torch.arange(12), torch.arange(20)])[None]
    other = row.clone()
    other[0, :12] = torch.randint(0, 256, (12,), generator=gen)
    with torch.no_grad():
        a, b = model(row, positions=positions), model(other, positions=positions)
    assert not torch.equal(a[0, :12], b[0, :12])  # document 1 did change
    assert torch.equal(a[0, 12:], b[0, 12:])
    # Alone (positions from 0, nothing before it), document 2 gives the same logits.
    with torch.no_grad():
        alone = model(row[:, 12:])
    torch.testing.assert_close(a[:, 12:], alone, rtol=0, atol=1e-5)


def test_the_packed_loss_is_the_unpacked_loss_of_the_same_samples(tmp_path, word_tokenizer):
    from workers.stepper import masked_loss_sum

    folder, _ = word_tokenizer
    rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in _rows(16)]
    base = prep(tmp_path, folder, rows, shape="instruction", seq_len=40, vocab_size=256)
    packed = PackedDataset(base)
    model = _model()
    x, y, pos = [], [], []
    for r in range(len(packed)):
        tokens, labels = packed[r]
        x.append(tokens[:-1])
        y.append(labels)
        pos.append(packed.positions(r))
    with torch.no_grad():
        logits = model(torch.stack(x), positions=torch.stack(pos))
        packed_loss = masked_loss_sum(logits, torch.stack(y)) / sum(packed.counts)
        samples = [base[i] for i in range(len(base))]
        unpacked = model(torch.stack([t[:-1] for t, _ in samples]))
        labels = torch.stack([lab for _, lab in samples])
        unpacked_loss = masked_loss_sum(unpacked, labels) / int((labels != IGNORE_INDEX).sum())
    assert len(packed) < len(base) / 2
    assert float(packed_loss) == pytest.approx(float(unpacked_loss), rel=1e-6)
