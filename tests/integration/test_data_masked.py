"""Masked (instruction) data on real gloo process groups: the loss is the global batch's
mean over completion tokens whatever the world size, micro-batching or strategy (DDP,
FSDP, TP, PP, PP x DP), workers
tokenize a raw file once per node, and a job resumes exactly on prepared data."""

from __future__ import annotations

import os
import random

import pytest
import torch

from tests.support.hf_fixtures import make_word_tokenizer
from tests.support.local_launch import LocalJob, run_local_groups
from tests.unit.workers.data.conftest import write_jsonl
from workers.data.prepare import prepare
from workers.data.samples import ShapeOptions
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

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


def spec(name, workers, parallelism, data: dict, *, tokenizer=None, mbs=2) -> dict:
    raw = {
        "name": name,
        "model": {"preset": "gpt-tiny", **({"tokenizer": tokenizer} if tokenizer else {})},
        "data": {"seq_len": 16, **data},
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": parallelism,
        "train": {
            "steps": STEPS,
            "global_batch_size": 8,
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


@pytest.fixture(scope="module")
def results(data):
    root, raw = data
    prepared = {"source": "prepared", "path": str(root / "prepared")}
    jsonl = {"source": "jsonl", "path": raw, "shape": "instruction"}
    tok = str(root / "tok")
    jobs = [
        LocalJob("ddp2", spec("ddp2", 2, {"strategy": "ddp"}, prepared)),
        LocalJob("fsdp2", spec("fsdp2", 2, {"strategy": "fsdp"}, prepared, mbs=4)),
        LocalJob("pp2", spec("pp2", 2, PP, prepared, mbs=1)),
        LocalJob("tp2", spec("tp2", 2, {"strategy": "tp", "tp": 2}, prepared)),
        LocalJob("ddp2-raw", spec("ddp2-raw", 2, {"strategy": "ddp"}, jsonl, tokenizer=tok)),
        LocalJob(
            "save", spec("save", 2, {"strategy": "ddp"}, prepared), str(root / "ck"), stop_at=3
        ),
    ]
    # Pipeline stages with data parallelism inside them: the dp factor on the pp loss.
    hybrid = {"strategy": "hybrid", "pp": 2, "pipeline": {"microbatches": 2}}
    pp2_dp2 = LocalJob("pp2-dp2", spec("pp2-dp2", 4, hybrid, prepared))
    out = run_local_groups([(2, jobs), (4, [pp2_dp2])])  # one set of 4 processes
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
