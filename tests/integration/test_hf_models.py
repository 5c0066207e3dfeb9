"""model.hf on every strategy: a sharded Hugging Face checkpoint loads into each rank's shard.

A tiny Qwen2 (q/k/v biases, GQA, sharded safetensors with an index) trains under DDP,
FSDP ZeRO-3 and ZeRO-2 with CPU offload, TP, PP and hybrid layouts on local gloo
processes; the first loss equals transformers' on the same global batch and every step
equals a single-process etrain run from the same weights, and its export loads back into
transformers with etrain's logits. A separate ~190 MB Llama checkpoint (written with safetensors)
measures each rank's peak host memory while loading: under FSDP and TP it stays below
the whole model, under DDP (which replicates it) it does not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tests.support.hf_fixtures import make_hf_folder
from tests.support.hf_load_memory import measure_load, write_random_llama
from tests.support.local_launch import LocalJob, run_local_groups
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS = 3
OPTIMIZERS = {"sgd": {"optimizer": "sgd", "momentum": 0.9}, "adamw": {"optimizer": "adamw"}}
LAYOUTS = {
    "ddp2": (2, {"strategy": "ddp"}),
    "fsdp2-zero3": (2, {"strategy": "fsdp", "fsdp": {"zero_stage": 3}}),
    "fsdp2-zero2-offload": (
        2,
        {"strategy": "fsdp", "fsdp": {"zero_stage": 2, "cpu_offload": True}},
    ),
    "tp2": (2, {"strategy": "tp", "tp": 2}),
    "pp2": (2, {"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 2}}),
    "hybrid-dp2-tp2": (4, {"strategy": "hybrid", "tp": 2}),
    "hybrid-pp2-tp2": (
        4,
        {"strategy": "hybrid", "pp": 2, "tp": 2, "pipeline": {"microbatches": 2}},
    ),
}


def _spec(folder: Path, workers: int, parallelism: dict, optimizer: str) -> dict:
    spec = {
        "name": "hf",
        "model": {"hf": str(folder)},
        "data": {"seq_len": 16, "num_samples": 64},
        "train": {
            "steps": STEPS,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-2,
            "warmup_steps": 1,
            **OPTIMIZERS[optimizer],
        },
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": parallelism,
    }
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2")
    make_hf_folder(folder, "qwen2", seed=5, max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


def _single(folder: Path, optimizer: str, checkpoints: str | None = None):
    spec = copy.deepcopy(_spec(folder, 1, {"strategy": "ddp"}, optimizer))
    if checkpoints:
        spec["checkpoint"] = {"every_steps": STEPS, "storage": f"file://{checkpoints}"}
        checkpoints = f"file://{checkpoints}"
    env = RunEnv(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=locate(checkpoints) if checkpoints else None,
    )
    return run(JobSpec.model_validate(spec), env)


@pytest.fixture(scope="module")
def reference_runs(qwen_folder, tmp_path_factory) -> dict:
    """One process per optimizer; the SGD run also checkpoints its last step (for export)."""
    ckpts = tmp_path_factory.mktemp("ckpts")
    runs = {
        opt: _single(qwen_folder, opt, str(ckpts) if opt == "sgd" else None) for opt in OPTIMIZERS
    }
    return {**runs, "checkpoints": f"file://{ckpts}"}


@pytest.fixture(scope="module")
def references(reference_runs) -> dict[str, dict[int, float]]:
    return {opt: reference_runs[opt].losses for opt in OPTIMIZERS}


@pytest.fixture(scope="module")
def results(qwen_folder) -> dict:
    groups = [
        (
            world,
            [
                LocalJob(f"{name}-{opt}", _spec(qwen_folder, workers, par, opt))
                for name, (workers, par) in LAYOUTS.items()
                if workers == world
                for opt in OPTIMIZERS
            ],
        )
        for world in (2, 4)
    ]
    return run_local_groups(groups)  # both sizes on one set of 4 processes


def test_first_loss_equals_transformers_on_the_same_global_batch(qwen_folder, references):
    from transformers import AutoModelForCausalLM

    from workers.data import GlobalBatchSampler, collate
    from workers.models.hf_load import spec_model_config
    from workers.train_loop import _dataset

    spec = JobSpec.model_validate(_spec(qwen_folder, 1, {"strategy": "ddp"}, "sgd"))
    dataset = _dataset(spec, spec_model_config(spec))
    batch = GlobalBatchSampler(len(dataset), seed=spec.train.seed).next_global_batch(8)
    inputs, targets = collate(dataset, batch)
    ref = AutoModelForCausalLM.from_pretrained(qwen_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(inputs).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    assert references["sgd"][1] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_trains_like_one_process(results, references, layout, optimizer):
    got = results[f"{layout}-{optimizer}"]
    assert got.error is None, got.error
    want = references[optimizer]
    assert set(got.losses) == set(want) == set(range(1, STEPS + 1))
    assert want[STEPS] < want[1]  # it trains
    for step, loss in got.losses.items():
        assert loss == pytest.approx(want[step], rel=1e-4), f"{layout} {optimizer} step {step}"


def test_export_is_a_hugging_face_folder_of_the_source_architecture(
    qwen_folder, reference_runs, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.checkpoint.export import export_checkpoint
    from workers.checkpoint.manager import CheckpointManager
    from workers.storage.location import resolve_storage

    run_, root = reference_runs["sgd"], reference_runs["checkpoints"]
    (ckpt,) = CheckpointManager(resolve_storage(root), keep_last=None, rank=0).committed()
    result = export_checkpoint(ckpt.uri, tmp_path / "out", hf=str(qwen_folder), naming="etrain")
    assert (result.step, result.naming) == (STEPS, "hf")  # a HF folder whatever naming says
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((qwen_folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["rope_parameters"] == source["rope_parameters"]
    assert config["rms_norm_eps"] == source["rms_norm_eps"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "out" / name).read_bytes() == (qwen_folder / name).read_bytes()
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    tokens = torch.tensor([tok("Fine-tuning a pretrained model").input_ids])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(
            hf(tokens).logits, run_.model.eval()(tokens), atol=1e-5, rtol=1e-5
        )
        before = AutoModelForCausalLM.from_pretrained(qwen_folder, dtype=torch.float32)(tokens)
    assert not torch.allclose(before.logits, hf(tokens).logits, atol=1e-3)  # it did train


# --- peak host memory per rank while loading -------------------------------------------


def test_loading_under_fsdp_and_tp_holds_less_than_the_whole_model(tmp_path):
    whole = write_random_llama(tmp_path / "big")
    per_rank = measure_load(tmp_path / "big", world_size=2)
    mib = 1 << 20
    print(f"\nwhole model {whole / mib:.0f} MiB; peak host memory growth while loading:")
    for rank, rec in enumerate(per_rank):
        print(
            "  rank",
            rank,
            {k: f"{v['peak_bytes'] / mib:.0f} MiB in {v['seconds']:.2f}s" for k, v in rec.items()},
        )
    for rec in per_rank:
        assert rec["fsdp"]["peak_bytes"] < 0.75 * whole
        assert rec["tp"]["peak_bytes"] < 0.75 * whole
        # The measurement sees a whole model when the layout holds one.
        assert rec["ddp"]["peak_bytes"] > 0.8 * whole
