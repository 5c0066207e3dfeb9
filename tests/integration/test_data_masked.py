"""Masked (instruction) data on real gloo process groups: the loss is the global batch's
mean over completion tokens whatever the world size, micro-batching or strategy (DDP,
FSDP, TP, PP, PP x DP), workers
tokenize a raw file once per node, and a job resumes exactly on prepared data."""

from __future__ import annotations

import os
import random

import pytest
import torch

from tests.support.eval_reference import evaluate_checkpoint
from tests.support.hf_fixtures import make_word_tokenizer
from tests.support.local_launch import LocalJob, run_local_groups
from tests.unit.workers.data.conftest import write_jsonl
from workers.data.prepare import prepare
from workers.data.samples import ShapeOptions
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

STEPS = 6
WORDS = "the quick brown fox jumps over lazy dog hello world answer four".split()  # noqa: SIM905
PP = {"strategy": "pp", "pp": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A word tokenizer, 40 instruction rows with completions of 1..8 words, and their
    prepared folder; worker caches go to a fresh folder."""
    root = tmp_path_factory.mktemp("masked")
    make_word_tokenizer(root / "tok", corpus=[" ".join(WORDS)])
    rng = random.Random(0)
    rows = [
        {
            "prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 6))),
            "completion": " ".join(rng.choices(WORDS, k=rng.randint(1, 8))),
        }
        for _ in range(40)
    ]
    raw = write_jsonl(root / "rows.jsonl", rows)
    opts = ShapeOptions(shape="instruction", seq_len=16)
    prepare(
        source="jsonl",
        path=raw,
        tokenizer=str(root / "tok"),
        opts=opts,
        out=str(root / "prepared"),
        vocab_size=256,
    )
    old = os.environ.get("ETRAIN_DATA_CACHE")
    os.environ["ETRAIN_DATA_CACHE"] = str(root / "cache")
    yield root, raw
    if old is None:
        os.environ.pop("ETRAIN_DATA_CACHE", None)
    else:
        os.environ["ETRAIN_DATA_CACHE"] = old


def spec(name, workers, parallelism, data: dict, *, tokenizer=None, mbs=2, gbs=8) -> dict:
    raw = {
        "name": name,
        "model": {"preset": "gpt-tiny", **({"tokenizer": tokenizer} if tokenizer else {})},
        "data": {"seq_len": 16, **data},
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": parallelism,
        "train": {
            "steps": STEPS,
            "global_batch_size": gbs,
            "micro_batch_size": mbs,
            "lr": 0.05,
            "warmup_steps": 1,
            "optimizer": "sgd",
            "momentum": 0.9,
        },
        "checkpoint": {"every_steps": 3},
    }
    return JobSpec.model_validate(raw).model_dump(mode="json", by_alias=True)


def single(spec_dict, checkpoint_root=None) -> dict[int, float]:
    where = locate(checkpoint_root) if checkpoint_root else None
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=where)
    return run(JobSpec.model_validate(spec_dict), env).losses


# Two jobs also evaluate a masked held-out set of its own (the same rows: training is
# unchanged by it) every 3 steps: the prepared folder under TP, the raw rows under DDP.
EVALUATED = {"tp2": {"strategy": "tp", "tp": 2}, "ddp2-raw": {"strategy": "ddp"}}


def evaluated(name: str, data: dict, held: dict, tokenizer=None) -> dict:
    raw = spec(name, 2, EVALUATED[name], {**data, "eval": held}, tokenizer=tokenizer)
    raw["train"].update(eval_every_steps=3, eval_samples=13)
    return JobSpec.model_validate(raw).model_dump(mode="json", by_alias=True)


def mixed(workers: int) -> dict:
    """Two sources by weight 2:1, the prepared masked rows and synthetic text (global batch
    12: whole for 1, 2, 3 and 4 workers)."""
    root = MIXED_ROOT[0]
    sources = [
        {"source": "prepared", "path": str(root / "prepared"), "weight": 2},
        {"source": "synthetic", "num_samples": 30, "weight": 1},
    ]
    raw = spec("mix", workers, {"strategy": "ddp"}, {"sources": sources}, mbs=1, gbs=12)
    raw["checkpoint"]["every_steps"] = 2
    return JobSpec.model_validate(raw).model_dump(mode="json", by_alias=True)


MIXED_ROOT: list = []
PACKED = {
    "ddp2": {"strategy": "ddp"},
    "fsdp2": {"strategy": "fsdp"},
    "tp2": {"strategy": "tp", "tp": 2},
}


def packed(name: str, workers: int = 2) -> dict:
    """The prepared rows packed (data.packing) under ``name``'s layout."""
    data = {"source": "prepared", "path": str(MIXED_ROOT[0] / "prepared"), "packing": True}
    par = PACKED[name] if workers == 2 else {"strategy": "ddp"}
    return spec(f"packed-{name}", workers, par, data, mbs=1, gbs=4)


def unpacked_reference(spec_dict: dict) -> dict[int, float]:
    """One process trains on each step's samples unpacked: the packed job's rows of that
    step (drawn by the same sampler) opened into their samples, one padded row each."""
    from workers.build import build_stepper, stores_of
    from workers.data.packing import PackedDataset
    from workers.data.sampler import GlobalBatchSampler
    from workers.train_loop import _dataset, spec_model_config

    job = JobSpec.model_validate(spec_dict)
    flat = job.model_copy(update={"data": job.data.model_copy(update={"packing": False})})
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False)
    cfg = spec_model_config(flat, stores_of(flat))
    base = _dataset(flat, cfg)
    rows = PackedDataset(base)
    stepper, schedulers = build_stepper(flat, env, base, cfg)
    sampler = GlobalBatchSampler(len(rows), seed=job.train.seed)
    losses = {}
    for step in range(1, job.train.steps + 1):
        batch = sampler.next_global_batch(job.train.global_batch_size)
        samples = [(0, i) for _, r in batch for i in rows.samples(r)]
        losses[step], _ = stepper.step(samples)
        stepper.zero_grad()
        for sched in schedulers:
            sched.step()
    return losses


@pytest.fixture(scope="module")
def results(data):
    root, raw = data
    MIXED_ROOT[:] = [root]
    prepared = {"source": "prepared", "path": str(root / "prepared")}
    jsonl = {"source": "jsonl", "path": raw, "shape": "instruction"}
    tok = str(root / "tok")
    jobs = [
        LocalJob("ddp2", spec("ddp2", 2, {"strategy": "ddp"}, prepared)),
        LocalJob("fsdp2", spec("fsdp2", 2, {"strategy": "fsdp"}, prepared, mbs=4)),
        LocalJob("pp2", spec("pp2", 2, PP, prepared, mbs=1)),
        LocalJob("tp2", evaluated("tp2", prepared, prepared), str(root / "tp2")),
        LocalJob("ddp2-raw", evaluated("ddp2-raw", jsonl, jsonl, tok), str(root / "ddp2-raw")),
        LocalJob(
            "save", spec("save", 2, {"strategy": "ddp"}, prepared), str(root / "ck"), stop_at=3
        ),
    ]
    # Pipeline stages with data parallelism inside them: the dp factor on the pp loss.
    hybrid = {"strategy": "hybrid", "pp": 2, "pipeline": {"microbatches": 2}}
    pp2_dp2 = LocalJob("pp2-dp2", spec("pp2-dp2", 4, hybrid, prepared))
    # A mixture of the prepared rows and a synthetic text source, saved by 3 workers at
    # step 2, resumed by 2 up to step 4 (saved), then by 4 to the end.
    ck = str(root / "mixed")
    mix = [
        LocalJob("mix-3", mixed(3), ck, stop_at=2),
        LocalJob("mix-2", mixed(2), ck, stop_at=4),
        LocalJob("mix-4", mixed(4), ck),
    ]
    # Packed rows under three layouts.
    jobs += [LocalJob(f"packed-{name}", packed(name)) for name in PACKED]
    # One set of 4 processes for every group.
    out = run_local_groups([(2, jobs), (3, mix[:1]), (2, mix[1:2]), (4, [pp2_dp2, mix[2]])])
    out["mix-reference"] = single(mixed(1))
    out["unpacked"] = unpacked_reference(packed("ddp2", workers=1))
    # The reference: one process, the whole global batch in micro-batches of 1.
    out["reference"] = single(spec("ref", 1, {"strategy": "ddp"}, prepared, mbs=1))
    # Elastic shrink: the job saved on 2 ranks at step 3 resumes on 1.
    out["resume"] = single(spec("save", 1, {"strategy": "ddp"}, prepared), str(root / "ck"))
    return out


@pytest.mark.parametrize("name", ["ddp2", "fsdp2", "tp2", "pp2", "pp2-dp2", "ddp2-raw"])
def test_masked_loss_matches_one_process(results, name):
    got = results[name]
    assert got.error is None, got.error
    ref = results["reference"]
    assert set(got.losses) == set(ref) == set(range(1, STEPS + 1))
    for step, loss in ref.items():
        assert got.losses[step] == pytest.approx(loss, rel=1e-4, abs=1e-5), (name, step)
    assert ref[STEPS] < ref[1]


@pytest.mark.parametrize("name", list(EVALUATED))
def test_masked_evaluation_equals_one_process_on_the_same_weights(data, results, name):
    root, raw = data
    got = results[name]
    assert got.error is None, got.error
    assert sorted(got.eval_losses) == [3, 6]
    data_section = (
        {"source": "prepared", "path": str(root / "prepared")}
        if name == "tp2"
        else {"source": "jsonl", "path": raw, "shape": "instruction"}
    )
    tok = None if name == "tp2" else str(root / "tok")
    job = JobSpec.model_validate(evaluated(name, data_section, data_section, tok))
    for step in (3, 6):
        want = evaluate_checkpoint(job, root / name, step)
        assert got.eval_losses[step] == pytest.approx(want, rel=1e-6), step


def test_a_mixture_resumed_by_3_then_2_then_4_workers_draws_what_one_process_draws(results):
    """Each segment's losses equal one uninterrupted process's: the same samples of each
    source in the same global batches, whatever the world size (the sampler's own once-per-
    epoch guarantee is tests/unit/workers/data/test_mixture.py's)."""
    ref = results["mix-reference"]
    for name, steps, resumed in (
        ("mix-3", (1, 2), None),
        ("mix-2", (3, 4), 2),
        ("mix-4", (5, 6), 4),
    ):
        got = results[name]
        assert got.error is None, got.error
        assert sorted(got.losses) == list(steps) and got.resumed_from == resumed
        for step in steps:
            assert got.losses[step] == pytest.approx(ref[step], rel=1e-4, abs=1e-5), (name, step)


@pytest.mark.parametrize("name", list(PACKED))
def test_packed_loss_equals_the_unpacked_loss_of_the_same_samples(results, name):
    got = results[f"packed-{name}"]
    assert got.error is None, got.error
    want = results["unpacked"]
    assert sorted(got.losses) == sorted(want) == list(range(1, STEPS + 1))
    for step, loss in want.items():
        assert got.losses[step] == pytest.approx(loss, rel=1e-5), (name, step)


def test_workers_tokenize_a_raw_file_once_per_node(data, results):
    root, _ = data
    assert results["ddp2-raw"].error is None
    # The node cache has one folder per tenant (these processes run with no roots: "local")
    (tenant,) = [p for p in (root / "cache").iterdir() if p.is_dir()]
    entries = [p for p in tenant.iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "index.json").is_file()


def test_resume_on_prepared_data_after_a_shrink_is_exact(results):
    assert results["save"].error is None, results["save"].error
    ref, resumed = results["reference"], results["resume"]
    assert set(resumed) == {4, 5, 6}
    for step in resumed:
        assert resumed[step] == pytest.approx(ref[step], rel=1e-4, abs=1e-5)
