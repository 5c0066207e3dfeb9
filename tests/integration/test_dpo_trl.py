"""Objective dpo against TRL's ``DPOTrainer`` (the reference implementation), for the
sigmoid and the IPO loss, on a Hugging Face policy, another folder as the reference and the
pairs etrain tokenized:

- on fixed logits (the two transformers models'), etrain's loss function gives the
  trainer's loss and rewards (chosen, rejected, margin, accuracy) within 1e-6;
- a one-process etrain job's first step (etrain's decoder loading both folders) gives them
  within the decoder's agreement with transformers (1e-5)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.support.hf_fixtures import CORPUS, make_hf_folder, make_hf_model
from workers.build import stores_of
from workers.models.hf_load import spec_model_config
from workers.spec import JobSpec
from workers.train_loop import RunEnv, _dataset, run

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

PAIRS, BETA = 4, 0.2


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A policy folder (model and tokenizer), another model as the reference, and rows."""
    root = tmp_path_factory.mktemp("dpo-trl")
    make_hf_folder(root / "policy", "llama", seed=0)
    make_hf_model(root / "ref", "llama", seed=1)
    words = " ".join(CORPUS).split()
    rng = random.Random(1)
    with open(root / "pairs.jsonl", "w") as f:
        for _ in range(PAIRS):
            row = {k: " ".join(rng.choices(words, k=rng.randint(2, 5))) for k in ("prompt",)}
            row |= {
                k: " " + " ".join(rng.choices(words, k=rng.randint(1, 6)))
                for k in ("chosen", "rejected")
            }
            f.write(json.dumps(row) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ETRAIN_DATA_CACHE", str(root / "cache"))
        yield root


def _spec(root, loss: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "dpo-trl",
            "objective": "dpo",
            "dpo": {"beta": BETA, "loss": loss, "reference": str(root / "ref")},
            "model": {"hf": str(root / "policy")},
            "data": {
                "source": "jsonl",
                "path": str(root / "pairs.jsonl"),
                "shape": "preference",
                "seq_len": 40,
            },
            "resources": {"workers": 1},
            "train": {"steps": 1, "global_batch_size": PAIRS, "micro_batch_size": 2, "lr": 1e-3},
        }
    )


def _trl_inputs(spec: JobSpec) -> dict:
    """etrain's token rows as TRL's collated batch: every chosen row, then every rejected
    row; ``completion_mask`` marks the tokens the labels count, right padding is masked."""
    pairs = _dataset(spec, spec_model_config(spec, stores_of(spec)))
    rows = [pairs[i][0] for i in range(len(pairs))] + [pairs[i][1] for i in range(len(pairs))]
    ids = torch.stack([tokens for tokens, _ in rows])
    counted = torch.stack([labels != -100 for _, labels in rows])
    completion = torch.cat([torch.zeros(len(rows), 1, dtype=torch.bool), counted], dim=1)
    last = completion.long().cumsum(1).argmax(1)  # the last counted token (eos) of each row
    attention = torch.arange(ids.shape[1]) <= last[:, None]
    return {
        "input_ids": ids,
        "attention_mask": attention.long(),
        "completion_mask": completion.long(),
    }


def _trl(root, spec: JobSpec, loss: str, tmp_path) -> tuple[float, dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(line) for line in (root / "pairs.jsonl").read_text().splitlines()]
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(root / "policy", dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(root / "ref", dtype=torch.float32),
        args=DPOConfig(
            output_dir=str(tmp_path / "trl"),
            beta=BETA,
            loss_type=[loss],
            report_to="none",
            per_device_train_batch_size=PAIRS,
            activation_checkpointing=False,
            use_cpu=True,
            bf16=False,  # TRL's default is bf16 autocast where the machine has it
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(root / "policy"),
    )
    trainer.model.train()
    with torch.no_grad():
        value = trainer._compute_loss(trainer.model, _trl_inputs(spec), return_outputs=False)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("rewards/")}
    return float(value), metrics


def _etrain_on_fixed_logits(root, inputs: dict, loss: str) -> tuple[float, dict]:
    """etrain's loss function on the transformers models' logits of TRL's inputs."""
    from transformers import AutoModelForCausalLM

    from workers.objectives.dpo import METRICS, pair_losses, sequence_logps

    ids = inputs["input_ids"]
    labels = ids[:, 1:].masked_fill(inputs["completion_mask"][:, 1:] == 0, -100)
    logps = {}
    for name in ("policy", "ref"):
        model = AutoModelForCausalLM.from_pretrained(root / name, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(ids[:, :-1], attention_mask=inputs["attention_mask"][:, :-1]).logits
        logps[name], counts = sequence_logps(logits, labels)
    per, sums = pair_losses(logps["policy"], logps["ref"], counts, beta=BETA, loss=loss)
    return float(per.mean()), dict(zip(METRICS, (sums / len(per)).tolist(), strict=True))


def _assert_same(loss, metrics, want_loss, want, *, tol):
    assert loss == pytest.approx(want_loss, rel=tol, abs=tol)
    for ours, theirs in (
        ("rewards_chosen", "rewards/chosen"),
        ("rewards_rejected", "rewards/rejected"),
        ("rewards_margin", "rewards/margins"),
    ):
        assert metrics[ours] == pytest.approx(want[theirs], rel=tol, abs=tol), ours
    assert metrics["rewards_accuracy"] == pytest.approx(want["rewards/accuracies"], abs=1e-9)
    assert abs(metrics["rewards_margin"]) > 1e-3  # another reference: the rewards are not zero


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_loss_and_rewards_equal_trls(folders, loss, tmp_path):
    spec = _spec(folders, loss)
    want_loss, want = _trl(folders, spec, loss, tmp_path)
    fixed_loss, fixed = _etrain_on_fixed_logits(folders, _trl_inputs(spec), loss)
    _assert_same(fixed_loss, fixed, want_loss, want, tol=1e-6)
    result = run(spec, RunEnv(0, 1, torch.device("cpu"), measure_memory=False))
    _assert_same(result.losses[1], result.metrics[1], want_loss, want, tol=1e-5)
