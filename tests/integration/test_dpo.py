"""Objective dpo on real gloo process groups: each step's loss, rewards and held-out loss
on 2 ranks (DDP, FSDP ZeRO-2 / ZeRO-3, with offload, LoRA on both; SGD and AdamW; sigmoid
and IPO) equal one process's; a job resumed from its checkpoint repeats the uninterrupted
run bit for bit; with LoRA the reference is the base model (adapters off), bit for bit."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from tests.support.hf_fixtures import make_word_tokenizer
from tests.support.local_launch import LocalJob, run_local
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS = 4
WORDS = "the quick brown fox jumps over lazy dog hello world answer four".split()  # noqa: SIM905
OPTIMIZERS = {"sgd": {"optimizer": "sgd", "lr": 0.5}, "adamw": {"optimizer": "adamw", "lr": 1e-2}}
FSDP3 = {"strategy": "fsdp", "fsdp": {"zero_stage": 3}}
# name: (parallelism, optimizer, lora, dpo options)
ROWS = {
    "ddp-sgd": ({"strategy": "ddp"}, "sgd", False, {}),
    "ddp-adamw": ({"strategy": "ddp"}, "adamw", False, {}),
    "fsdp2-adamw": ({"strategy": "fsdp", "fsdp": {"zero_stage": 2}}, "adamw", False, {}),
    "fsdp3-sgd": (FSDP3, "sgd", False, {}),
    "fsdp3-offload-adamw": (
        {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
        "adamw",
        False,
        {},
    ),
    "lora-ddp-adamw": ({"strategy": "ddp"}, "adamw", True, {}),
    "lora-fsdp3-sgd": (FSDP3, "sgd", True, {}),
    "ipo-fsdp3-adamw": (FSDP3, "adamw", False, {"loss": "ipo", "beta": 0.5}),
    # DeepSpeed: the policy in the engine, the reference (or the adapters-off base) beside it.
    "deepspeed3-sgd": ({"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}, "sgd", False, {}),
    "lora-deepspeed2-adamw": (
        {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}},
        "adamw",
        True,
        {},
    ),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A word tokenizer and 40 preference rows (answers of 1..5 words); worker caches in
    a fresh folder."""
    root = tmp_path_factory.mktemp("dpo")
    make_word_tokenizer(root / "tok", corpus=[" ".join(WORDS)])
    rng = random.Random(0)
    with open(root / "pairs.jsonl", "w") as f:
        for _ in range(40):
            row = {
                "prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 4))),
                "chosen": " ".join(rng.choices(WORDS, k=rng.randint(1, 5))),
                "rejected": " ".join(rng.choices(WORDS, k=rng.randint(1, 5))),
            }
            f.write(json.dumps(row) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ETRAIN_DATA_CACHE", str(root / "cache"))
        yield root


def make_spec(root, row: str, workers: int) -> dict:
    par, opt, lora, dpo = ROWS[row]
    model = {"preset": "gpt-tiny", "tokenizer": str(root / "tok")}
    if lora:
        model["lora"] = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    spec = {
        "name": f"dpo-{row}",
        "objective": "dpo",
        "dpo": {"beta": 0.2, **dpo},
        "model": model,
        "data": {
            "source": "jsonl",
            "path": str(root / "pairs.jsonl"),
            "shape": "preference",
            "seq_len": 16,
            "eval_fraction": 0.2,
        },
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": par if workers > 1 else {"strategy": "ddp"},
        "train": {
            "steps": STEPS,
            "global_batch_size": 4,
            "micro_batch_size": 1,
            "eval_every_steps": 2,
            **OPTIMIZERS[opt],
        },
        "checkpoint": {"every_steps": 2, "keep_last": 2},
    }
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


def _key(row: str) -> tuple:
    """What one process must run to be row's reference: optimizer, LoRA, DPO options."""
    _, opt, lora, dpo = ROWS[row]
    return opt, lora, json.dumps(dpo, sort_keys=True)


@pytest.fixture(scope="module")
def references(pairs) -> dict:
    from tests.support.recording import RecordingReporter

    done: dict[tuple, object] = {}
    for row in ROWS:
        if _key(row) not in done:
            spec = JobSpec.model_validate(make_spec(pairs, row, 1))
            reporter = RecordingReporter("j-dpo")
            env = RunEnv(0, 1, torch.device("cpu"), reporter=reporter, measure_memory=False)
            done[_key(row)] = run(spec, env)
            done[_key(row)].points = [p.model_dump() for p in reporter.metrics]
    return done


def test_each_step_reports_the_rewards_and_no_perplexity(references):
    """The reported points carry the objective's metrics; exp(DPO loss) is no perplexity."""
    for result in references.values():
        assert [p["step"] for p in result.points] == list(range(1, STEPS + 1))
        for point in result.points:
            assert point["rewards_accuracy"] == result.metrics[point["step"]]["rewards_accuracy"]
            assert "eval_perplexity" not in point
        assert [p["step"] for p in result.points if "eval_loss" in p] == [2, 4]


@pytest.fixture(scope="module")
def results(pairs):
    jobs = [LocalJob(row, make_spec(pairs, row, 2)) for row in ROWS]
    for row in ("lora-fsdp3-sgd", "ddp-adamw"):
        spec, ckpt = make_spec(pairs, row, 2), str(pairs / f"ckpt-{row}")
        jobs.append(LocalJob(f"full-{row}", spec, str(pairs / f"full-{row}")))
        jobs.append(LocalJob(f"save-{row}", spec, ckpt, stop_at=2))
        jobs.append(LocalJob(f"resume-{row}", spec, ckpt))
    return run_local(jobs, world_size=2)


@pytest.mark.parametrize("row", list(ROWS))
def test_two_ranks_equal_one_process(results, references, row):
    got, want = results[row], references[_key(row)]
    assert got.error is None, got.error
    assert got.losses == pytest.approx(want.losses, rel=1e-5, abs=1e-6)
    assert got.eval_losses == pytest.approx(want.eval_losses, rel=1e-5, abs=1e-6)
    assert sorted(got.eval_losses) == [2, 4]
    for step, metrics in want.metrics.items():
        assert got.metrics[step] == pytest.approx(metrics, rel=1e-5, abs=1e-6), step
    # The model moved away from the reference: rewards are no longer all zero.
    assert any(abs(m["rewards_margin"]) > 1e-4 for m in got.metrics.values())
    assert all(0 <= m["rewards_accuracy"] <= 1 for m in got.metrics.values())


def test_the_first_step_starts_at_the_reference(references):
    """Before any update the trained model is its reference: every log-ratio is 0, so the
    sigmoid loss is log 2 and the IPO loss (1 / (2 beta))^2, whatever the data."""
    for (_, _, dpo), result in references.items():
        options = json.loads(dpo)
        if options.get("loss") == "ipo":
            assert result.losses[1] == pytest.approx((1 / (2 * options["beta"])) ** 2, rel=1e-6)
        else:
            assert result.losses[1] == pytest.approx(math.log(2), rel=1e-6)
        assert result.metrics[1]["rewards_margin"] == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("row", ["lora-fsdp3-sgd", "ddp-adamw"])
def test_a_resumed_job_repeats_the_uninterrupted_run_bitwise(results, row):
    full, saved, resumed = (results[f"{k}-{row}"] for k in ("full", "save", "resume"))
    for r in (full, saved, resumed):
        assert r.error is None, r.error
    assert resumed.resumed_from == 2
    assert {**saved.losses, **resumed.losses} == full.losses
    assert {**saved.metrics, **resumed.metrics} == full.metrics
    assert {**saved.eval_losses, **resumed.eval_losses} == full.eval_losses


def test_with_lora_the_reference_is_the_base_model_bit_for_bit():
    from workers.models.config import get_model_config
    from workers.models.llama import build_model
    from workers.models.lora import init_lora, inject_lora
    from workers.objectives.dpo import adapters_off
    from workers.spec import LoraSpec

    cfg = get_model_config("gpt-tiny")
    base = build_model(cfg, seed=3, device="cpu")
    tuned = copy.deepcopy(base)
    inject_lora(tuned, LoraSpec(rank=4, alpha=8))
    init_lora([tuned], seed=5)
    with torch.no_grad():  # adapters that change the output
        for name, p in tuned.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        assert not torch.equal(tuned(x), base(x))
        with adapters_off(tuned):
            assert torch.equal(tuned(x), base(x))
        assert not torch.equal(tuned(x), base(x))  # and on again
    assert all(p.requires_grad for n, p in tuned.named_parameters() if "lora_" in n)


def test_sigkilled_dpo_job_resumes_bitwise(results, pairs, run_job, telemetry_sink, tmp_path):
    """A real Ray job (LoRA, FSDP ZeRO-3), rank 1 SIGKILLed after step 3 (checkpoint at 2):
    its losses and held-out losses equal the uninterrupted run of the same spec on the same
    layout (local gloo group) bit for bit. It is also the suite's kill-and-resume on Ray of
    LoRA adapters (a checkpoint of the adapters alone, restored over the rebuilt base)."""
    from tests.support.faults import run_killed_once

    spec = make_spec(pairs, "lora-fsdp3-sgd", 2)
    env = {"ETRAIN_DATA_CACHE": str(pairs / "cache")}
    job_id = run_killed_once(
        run_job, telemetry_sink, spec=spec, job="dpo-kill", tmp_path=tmp_path, env=env
    )
    full = results["full-lora-fsdp3-sgd"]
    assert telemetry_sink.losses(job_id) == full.losses
    assert telemetry_sink.eval_losses(job_id) == full.eval_losses
