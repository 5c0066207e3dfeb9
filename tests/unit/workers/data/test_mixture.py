"""data.sources: samples mixed by weight, each source walking its own epochs, the same
draws whatever the world size and across a resume."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
import torch

from workers.data.datasets import SyntheticDataset
from workers.data.mixture import MixedDataset, MixtureSampler, source_of
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

SIZES, WEIGHTS = [300, 100, 50], [3.0, 2.0, 1.0]


def _draws(sampler: MixtureSampler, slots: int, batch: int = 12) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    while len(out) < slots:
        out.extend(sampler.next_global_batch(batch))
    return out[:slots]


def _source(item: int) -> tuple[int, int]:
    offsets = [0, 300, 400]
    k = max(j for j, o in enumerate(offsets) if o <= item)
    return k, item - offsets[k]


def test_the_sources_are_drawn_in_the_proportion_of_their_weights():
    draws = _draws(MixtureSampler(SIZES, WEIGHTS, seed=3), 6000)
    counts = Counter(_source(i)[0] for _, i in draws)
    for k, w in enumerate(WEIGHTS):
        assert counts[k] / 6000 == pytest.approx(w / sum(WEIGHTS), abs=0.01)
    # A smooth round robin: at any point each source is within one sample of its share.
    seen = [0, 0, 0]
    for n, (_, i) in enumerate(draws, start=1):
        seen[_source(i)[0]] += 1
        assert all(abs(seen[k] - n * w / sum(WEIGHTS)) < 1 + 1e-9 for k, w in enumerate(WEIGHTS))


def test_each_sample_of_each_source_is_drawn_once_per_its_epoch():
    draws = _draws(MixtureSampler(SIZES, WEIGHTS, seed=3), 3000)
    by_epoch: dict[tuple[int, int], list[int]] = defaultdict(list)
    for epoch, item in draws:
        k, i = _source(item)
        by_epoch[(k, epoch)].append(i)
    for (k, epoch), seen in by_epoch.items():
        assert len(seen) == len(set(seen)), (k, epoch)
        complete = (k, epoch + 1) in by_epoch
        if complete:
            assert sorted(seen) == list(range(SIZES[k])), (k, epoch)
    assert (2, 3) in by_epoch  # the small source went round several times


def test_a_resume_draws_exactly_what_the_uninterrupted_sampler_draws():
    whole = MixtureSampler(SIZES, WEIGHTS, seed=5)
    want = _draws(whole, 240)
    first = MixtureSampler(SIZES, WEIGHTS, seed=5)
    got = _draws(first, 84)  # 7 global batches, then a checkpoint
    state = json.loads(json.dumps(first.state_dict()))
    again = MixtureSampler(SIZES, WEIGHTS, seed=5)
    again.load_state_dict(state)
    assert got + _draws(again, 156) == want
    with pytest.raises(ValueError, match="cursor per source"):
        MixtureSampler(SIZES[:2], WEIGHTS[:2], seed=5).load_state_dict(state)


def test_a_text_source_beside_a_masked_one_counts_every_label():
    masked = _Masked()
    text = SyntheticDataset(seq_len=8, num_samples=5, vocab_size=32, seed=1)
    mixed = MixedDataset([masked, text], [1.0, 1.0])
    assert mixed.masked and len(mixed) == 9
    tokens, labels = mixed[4 + 2]
    assert torch.equal(labels, tokens[1:]) and mixed.counted(6) == 8
    assert mixed.counted(1) == 3
    assert source_of(mixed, [(0, 0), (0, 8)]).tolist() == [0, 1]


class _Masked:
    """Four masked samples of 8 + 1 tokens, 3 labels counted each (a unit-test stand-in
    with the dataset interface)."""

    masked = True
    seq_len = 8

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        tokens = torch.arange(9) + i
        labels = torch.full((8,), -100)
        labels[:3] = tokens[1:4]
        return tokens, labels

    def counted(self, i: int) -> int:
        return 3


def _spec(**train) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "mix",
            "data": {
                "seq_len": 16,
                "sources": [{"weight": 3, "num_samples": 40}, {"weight": 1, "num_samples": 9}],
            },
            "resources": {"workers": 1},
            "train": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 2, **train},
            "checkpoint": {"every_steps": 2, "keep_last": 5},
        }
    )


def test_a_mixed_job_resumes_exactly(tmp_path):
    from workers.storage.location import locate

    def env(root, stop_at=None):
        return RunEnv(0, 1, torch.device("cpu"), checkpoints=locate(str(root)), stop_at=stop_at)

    full = run(_spec(), env(tmp_path / "a"))
    run(_spec(), env(tmp_path / "b", stop_at=3))
    resumed = run(_spec(), env(tmp_path / "b"))
    assert resumed.resumed_from == 2
    assert {s: resumed.losses[s] for s in (3, 4, 5, 6)} == {s: full.losses[s] for s in (3, 4, 5, 6)}


def test_each_source_may_hold_out_its_own_evaluation_samples(tmp_path):
    from tests.support.eval_reference import evaluate_checkpoint
    from workers.build import stores_of
    from workers.storage.location import locate
    from workers.train_loop import _datasets, spec_model_config

    raw = _spec().model_dump(mode="json", by_alias=True)
    raw["data"]["sources"][0]["eval_fraction"] = 0.1  # 4 of 40; the second keeps all 9
    raw["train"]["eval_every_steps"] = 3
    job = JobSpec.model_validate(raw)
    train, evaluation = _datasets(job, spec_model_config(job, stores_of(job)))
    held = evaluation.dataset
    assert train.sizes == [36, 9] and held.sizes == [4] and evaluation.size == 4
    kept, out = train.datasets[0].indices, held.datasets[0].indices
    assert not set(kept) & set(out) and sorted(kept + out) == list(range(40))
    env = RunEnv(0, 1, torch.device("cpu"), checkpoints=locate(str(tmp_path)))
    result = run(job, env)
    assert sorted(result.eval_losses) == [3, 6]
    want = evaluate_checkpoint(job, tmp_path, 6)
    assert result.eval_losses[6] == pytest.approx(want, rel=1e-12)
