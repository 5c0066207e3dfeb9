"""model.hf on every strategy: a sharded Hugging Face checkpoint loads into each rank's shard.

A tiny Qwen2 (q/k/v biases, GQA, sharded safetensors with an index) trains under DDP,
FSDP ZeRO-3 and ZeRO-2 with CPU offload, TP, PP and hybrid layouts on local gloo
processes, and so do a tiny Qwen3 (per-head q/k norms), Gemma 2 (soft-capping, sliding
window layers), Gemma 3 (q/k norms, local RoPE base) and Phi-3 (fused qkv / gate-up
tensors, a sliding window): the first loss equals transformers' on the same global batch
and every step equals a single-process etrain run from the same weights, and its export
loads back into transformers with etrain's logits. A separate ~190 MB Llama checkpoint
(written with safetensors) measures each rank's peak host memory while loading: under
FSDP and TP it stays below the whole model, under DDP (which replicates it) it does not.
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

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

STEPS = 3
OPTIMIZERS = {"sgd": {"optimizer": "sgd", "momentum": 0.9}, "adamw": {"optimizer": "adamw"}}
# Qwen2 runs every layout with both optimizers; the other families with AdamW. The first
# optimizer's single-process run also checkpoints its last step, for the export test.
FAMILIES = {
    "qwen2": ("sgd", "adamw"),
    "qwen3": ("adamw",),
    "gemma2": ("adamw",),
    "gemma3": ("adamw",),
    "phi3": ("adamw",),
}
RUNS = [(family, opt) for family, opts in FAMILIES.items() for opt in opts]
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


# DeepSpeed on the sharded Qwen2 folder (both optimizers): the engine takes the loaded model.
DEEPSPEED_LAYOUTS = {
    "deepspeed2-zero2": (2, {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}),
    "deepspeed2-zero3-offload": (
        2,
        {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu"}},
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
def folders(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for family in FAMILIES:
        out[family] = folder = tmp_path_factory.mktemp(family)
        make_hf_folder(folder, family, seed=5, max_shard_size="40KB")
        assert (folder / "model.safetensors.index.json").is_file()
    return out


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
        measure_memory=False,
    )
    return run(JobSpec.model_validate(spec), env)


@pytest.fixture(scope="module")
def reference_runs(folders, tmp_path_factory) -> dict:
    """One process per family and optimizer; each family's first also checkpoints its last
    step (for export): {(family, optimizer): result, family: checkpoint root}."""
    runs: dict = {}
    for family, opts in FAMILIES.items():
        ckpts = tmp_path_factory.mktemp(f"ckpts-{family}")
        for opt in opts:
            first = opt == opts[0]
            runs[family, opt] = _single(folders[family], opt, str(ckpts) if first else None)
        runs[family] = f"file://{ckpts}"
    return runs


@pytest.fixture(scope="module")
def references(reference_runs) -> dict[tuple[str, str], dict[int, float]]:
    return {run_: reference_runs[run_].losses for run_ in RUNS}


@pytest.fixture(scope="module")
def results(folders) -> dict:
    groups = [
        (
            world,
            [
                LocalJob(f"{family}-{name}-{opt}", _spec(folders[family], workers, par, opt))
                for family, opt in RUNS
                for name, (workers, par) in LAYOUTS.items()
                if workers == world
            ],
        )
        for world in (2, 4)
    ]
    groups[0][1].extend(
        LocalJob(f"qwen2-{name}-{opt}", _spec(folders["qwen2"], workers, par, opt))
        for name, (workers, par) in DEEPSPEED_LAYOUTS.items()
        for opt in FAMILIES["qwen2"]
    )
    return run_local_groups(groups)  # both sizes on the session's 4 local ranks


@pytest.mark.parametrize("family", list(FAMILIES))
def test_first_loss_equals_transformers_on_the_same_global_batch(folders, references, family):
    from transformers import AutoModelForCausalLM

    from workers.data import GlobalBatchSampler, collate
    from workers.models.hf_load import spec_model_config
    from workers.train_loop import _dataset

    opt = FAMILIES[family][0]
    spec = JobSpec.model_validate(_spec(folders[family], 1, {"strategy": "ddp"}, opt))
    dataset = _dataset(spec, spec_model_config(spec))
    batch = GlobalBatchSampler(len(dataset), seed=spec.train.seed).next_global_batch(8)
    inputs, targets = collate(dataset, batch)
    ref = AutoModelForCausalLM.from_pretrained(folders[family], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(inputs).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    assert references[family, opt][1] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(("family", "optimizer"), RUNS, ids=[f"{f}-{o}" for f, o in RUNS])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_trains_like_one_process(results, references, layout, family, optimizer):
    got = results[f"{family}-{layout}-{optimizer}"]
    assert got.error is None, got.error
    want = references[family, optimizer]
    assert set(got.losses) == set(want) == set(range(1, STEPS + 1))
    assert want[STEPS] < want[1]  # it trains
    for step, loss in got.losses.items():
        assert loss == pytest.approx(want[step], rel=1e-4), f"{layout} {optimizer} step {step}"


@pytest.mark.parametrize("optimizer", FAMILIES["qwen2"])
@pytest.mark.parametrize("layout", list(DEEPSPEED_LAYOUTS))
def test_deepspeed_trains_a_sharded_qwen2_folder_like_one_process(
    results, references, layout, optimizer
):
    got = results[f"qwen2-{layout}-{optimizer}"]
    assert got.error is None, got.error
    want = references["qwen2", optimizer]
    assert set(got.losses) == set(want) == set(range(1, STEPS + 1))
    for step, loss in got.losses.items():
        assert loss == pytest.approx(want[step], rel=1e-5), f"{layout} {optimizer} step {step}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_is_a_hugging_face_folder_of_the_source_architecture(
    folders, reference_runs, tmp_path, family
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.hf_fixtures import ARCHITECTURES
    from workers.checkpoint.export import export_checkpoint
    from workers.checkpoint.manager import CheckpointManager
    from workers.storage.location import resolve_storage

    source_dir = folders[family]
    run_, root = reference_runs[family, FAMILIES[family][0]], reference_runs[family]
    (ckpt,) = CheckpointManager(resolve_storage(root), keep_last=None, rank=0).committed()
    result = export_checkpoint(ckpt.uri, tmp_path / "out", hf=str(source_dir), naming="etrain")
    assert (result.step, result.naming) == (STEPS, "hf")  # a HF folder whatever naming says
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((source_dir / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[family]]
    assert config["rope_parameters"] == source["rope_parameters"]
    assert config["rms_norm_eps"] == source["rms_norm_eps"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "out" / name).read_bytes() == (source_dir / name).read_bytes()
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    tokens = torch.tensor([tok("Fine-tuning a pretrained model with many more words").input_ids])
    assert tokens.shape[1] > 10  # past the tiny sliding windows
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert type(hf).__name__ == ARCHITECTURES[family]
    with torch.no_grad():
        torch.testing.assert_close(
            hf(tokens).logits, run_.model.eval()(tokens), atol=1e-5, rtol=1e-5
        )
        before = AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float32)(tokens)
    assert not torch.allclose(before.logits, hf(tokens).logits, atol=1e-3)  # it did train
    # One tensor per read batch (fused pieces streamed apart) writes the same file.
    export_checkpoint(ckpt.uri, tmp_path / "small", hf=str(source_dir), batch_bytes=1)
    model_file = "model.safetensors"
    assert (tmp_path / "small" / model_file).read_bytes() == (
        tmp_path / "out" / model_file
    ).read_bytes()


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
