"""LoRA on every data-parallel layout against a single-process LoRA run, and its checkpoints.

All 2-worker rows (DDP, FSDP zero 2/3, CPU offload, pipeline; SGD and AdamW;
a save that stops at step 3 and its resume in the same folder) run in one
group of 2 gloo processes. The references are plain single-process runs of
the same specs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tests.integration.test_cli_export import api  # noqa: F401 - the fixture
from tests.support.eval_reference import evaluate_checkpoint
from tests.support.local_launch import LocalJob, run_local
from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

STEPS = 4
# Rank 3: FSDP splits lora_A [3, in] unevenly over 2 ranks (2 + 1 rows).
LORA = {
    "rank": 3,
    "alpha": 8.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
}
BASE = {
    "model": {"preset": "gpt-tiny", "lora": LORA},
    "data": {"seq_len": 16, "num_samples": 64},
    "train": {
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 1e-2,
        "warmup_steps": 1,
        "seed": 3,
    },
    "checkpoint": {"every_steps": 2},
}
ROWS = {
    "ddp": {"strategy": "ddp"},
    "fsdp-zero2": {"strategy": "fsdp", "fsdp": {"zero_stage": 2}},
    "fsdp-zero3": {"strategy": "fsdp", "fsdp": {"zero_stage": 3}},
    "fsdp-offload": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
    "pp2": {"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 2}},
    "deepspeed-zero2": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}},
    "deepspeed-zero3-offload": {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    },
}
OPTIMIZERS = {"sgd": {"optimizer": "sgd", "momentum": 0.9}, "adamw": {"optimizer": "adamw"}}


BF16_ROWS = ["ddp", "fsdp-zero3", "deepspeed-zero3-offload"]


def make_spec(name: str, workers: int, parallelism: dict, optimizer: str) -> dict:
    spec = copy.deepcopy(BASE)
    spec["name"] = name
    spec["resources"] = {"workers": workers, "cpus_per_worker": 1}
    spec["parallelism"] = parallelism
    spec["train"].update(OPTIMIZERS[optimizer])
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


# The resumed jobs also evaluate a held-out set every 2 steps (held-out training samples
# under FSDP, a source of its own under DDP).
RESUMED = {
    "fsdp": {"eval_fraction": 0.1},
    "ddp": {"eval": {"source": "synthetic", "num_samples": 5}},
}


def resume_spec(name: str) -> dict:
    par = ROWS["fsdp-zero3"] if name == "fsdp" else ROWS["ddp"]
    spec = make_spec(f"resume-{name}", 2, par, "adamw")
    if name == "ddp":  # asynchronous saves, and retention keeping only the newest
        spec["checkpoint"].update({"async": True, "keep_last": 1})
    spec["data"].update(RESUMED[name])
    spec["train"]["eval_every_steps"] = 2
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


def single_process(optimizer: str):
    spec = make_spec("reference", 1, {"strategy": "ddp"}, optimizer)
    return run(
        JobSpec.model_validate(spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False),
    )


@pytest.fixture(scope="module")
def references() -> dict:
    return {opt: single_process(opt) for opt in OPTIMIZERS}


@pytest.fixture(scope="module")
def lora_results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("lora")
    jobs = [
        LocalJob(f"{row}-{opt}", make_spec(row, 2, par, opt))
        for row, par in ROWS.items()
        for opt in OPTIMIZERS
    ]
    for name in RESUMED:
        spec = resume_spec(name)
        ckpt = str(root / name)
        jobs.append(LocalJob(f"resume-{name}-full", spec, str(root / f"{name}-full")))
        jobs.append(LocalJob(f"resume-{name}-save", spec, ckpt, stop_at=2))
        jobs.append(LocalJob(f"resume-{name}-resume", spec, ckpt))
    for row in BF16_ROWS:  # frozen linears held in bf16 (no fp32 copy): FSDP2 mixes dtypes
        spec = make_spec(row, 2, ROWS[row], "adamw")
        spec["train"]["precision"] = "bf16"
        jobs.append(LocalJob(f"{row}-bf16", spec))
    # Elastic shrink: saved by 2 FSDP ranks, resumed by one process (DCP reshards).
    elastic = make_spec("elastic", 2, ROWS["fsdp-zero3"], "adamw")
    jobs.append(LocalJob("elastic-save", elastic, str(root / "elastic"), stop_at=2))
    results = run_local(jobs, world_size=2)
    results["root"] = root
    return results


def test_base_is_frozen_and_unchanged(references):
    """The single-process run trained only the adapters: every base tensor is as built."""
    model = references["adamw"].model
    base = build_model(get_model_config("gpt-tiny"), seed=3)
    trained = {n.replace(".base_layer", ""): p for n, p in model.named_parameters()}
    for name, want in base.named_parameters():
        assert not trained[name].requires_grad, name
        assert torch.equal(trained[name], want), name
    adapters = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert adapters and all(p.abs().sum() > 0 for p in adapters)  # B started at zero and trained


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("row", list(ROWS))
def test_lora_matches_single_process(lora_results, references, row, optimizer):
    res = lora_results[f"{row}-{optimizer}"]
    assert res.error is None, res.error
    want = references[optimizer].losses
    assert sorted(res.losses) == list(range(1, STEPS + 1))
    rel = 1e-5 if row.startswith("deepspeed") else 1e-4
    for step, loss in res.losses.items():
        assert loss == pytest.approx(want[step], rel=rel), f"{row} {optimizer} step {step}"
    assert res.losses[STEPS] < res.losses[1]


@pytest.fixture(scope="module")
def bf16_reference() -> dict[int, float]:
    spec = make_spec("reference-bf16", 1, {"strategy": "ddp"}, "adamw")
    spec["train"]["precision"] = "bf16"
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False)
    return run(JobSpec.model_validate(spec), env).losses


@pytest.mark.parametrize("row", BF16_ROWS)
def test_bf16_lora_matches_single_process(lora_results, bf16_reference, row):
    """bf16 autocast over a bf16-held frozen base, against the same in one process."""
    res = lora_results[f"{row}-bf16"]
    assert res.error is None, res.error
    assert sorted(res.losses) == list(range(1, STEPS + 1))
    for step, loss in res.losses.items():
        assert loss == pytest.approx(bf16_reference[step], rel=1e-3), f"{row} step {step}"


@pytest.mark.parametrize("name", ["fsdp", "ddp"])
def test_lora_resume_is_bitwise(lora_results, name):
    full = lora_results[f"resume-{name}-full"]
    saved = lora_results[f"resume-{name}-save"]
    resumed = lora_results[f"resume-{name}-resume"]
    for res in (full, saved, resumed):
        assert res.error is None, res.error
    assert resumed.resumed_from == 2
    assert {s: resumed.losses[s] for s in (3, 4)} == {s: full.losses[s] for s in (3, 4)}
    if name == "ddp":  # keep_last 1: the step-2 save was pruned once step 4 committed
        kept = sorted(p.name for p in (Path(lora_results["root"]) / "ddp-full").iterdir())
        assert kept == ["step_00000004"], kept


@pytest.mark.parametrize("name", list(RESUMED))
def test_lora_evaluation_equals_one_process_and_a_resume_repeats_it(lora_results, name):
    """The adapters' held-out loss equals one process's evaluation of the weights committed
    at that step; a job killed and resumed evaluates to the same loss, bit for bit."""
    full, resumed = lora_results[f"resume-{name}-full"], lora_results[f"resume-{name}-resume"]
    assert sorted(full.eval_losses) == [2, 4]
    assert resumed.eval_losses == {4: full.eval_losses[4]}
    spec = JobSpec.model_validate(resume_spec(name))
    want = evaluate_checkpoint(spec, Path(lora_results["root"]) / f"{name}-full", STEPS)
    assert full.eval_losses[STEPS] == pytest.approx(want, rel=1e-6)


def test_lora_resumes_after_an_elastic_shrink(lora_results, references):
    assert lora_results["elastic-save"].error is None, lora_results["elastic-save"].error
    spec = make_spec("elastic", 1, {"strategy": "ddp"}, "adamw")
    root = str(Path(lora_results["root"]) / "elastic")
    res = run(
        JobSpec.model_validate(spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(root)),
    )
    assert res.resumed_from == 2
    want = references["adamw"].losses
    for step in (3, 4):
        assert res.losses[step] == pytest.approx(want[step], rel=1e-4), step


def test_resume_on_another_base_is_refused(tmp_path):
    """The adapters of a checkpoint never land on a base they were not trained on."""
    spec = make_spec("rebase", 1, {"strategy": "ddp"}, "sgd")
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(tmp_path))
    run(JobSpec.model_validate(spec), RunEnv(**{**env.__dict__, "stop_at": 2}))
    spec["train"]["seed"] = 4  # the preset's random base is drawn from the seed
    with pytest.raises(ValueError, match=r"model\.lora: the checkpoint's adapters were trained"):
        run(JobSpec.model_validate(spec), env)


def test_lora_checkpoint_holds_only_adapters(lora_results):
    """Only adapter tensors and their optimizer state, plus the base reference."""
    import torch.distributed.checkpoint as dcp

    root = Path(lora_results["root"]) / "fsdp-full"
    step_dir = sorted(p for p in root.iterdir() if p.name.startswith("step_"))[-1]
    keys = list(dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("app.model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert not [k for k in keys if "base_layer" in k or "tok_embeddings" in k]
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["extra"]["lora_base"] == {"preset": "gpt-tiny", "seed": 3}


def _train_with_checkpoints(tmp_path, model: dict) -> tuple:
    """One process, AdamW, checkpoints every 2 steps: (trained etrain model, newest step dir)."""
    spec = make_spec("export", 1, {"strategy": "ddp"}, "adamw")
    spec["model"] = {"lora": LORA, **model} if model else spec["model"]
    root = tmp_path / "ckpt"
    res = run(
        JobSpec.model_validate(spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(root)),
    )
    step_dir = sorted(p for p in root.iterdir() if p.name.startswith("step_"))[-1]
    return res.model.eval(), step_dir


def _hf_logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize(
    "base", ["preset", "hf-llama", "hf-qwen2", "hf-qwen3", "hf-gemma2", "hf-gemma3", "hf-phi3"]
)
def test_adapter_export_loads_with_peft_and_merges(tmp_path, base):
    """peft loads the adapter over the base and gives etrain's logits; so does the merge.
    Phi-3's q/k/v adapters export as one (block-diagonal) adapter on its fused qkv_proj."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.support.hf_fixtures import make_hf_folder
    from workers.checkpoint.export_lora import export_adapter, export_merged, write_preset_base

    model = {}
    if base != "preset":
        make_hf_folder(tmp_path / "base", base.removeprefix("hf-"), vocab_size=256)
        model = {"hf": str(tmp_path / "base")}
    trained, step_dir = _train_with_checkpoints(tmp_path, model)
    base_dir = tmp_path / "base" if model else write_preset_base("gpt-tiny", 3, tmp_path / "base")
    result = export_adapter(step_dir, tmp_path / "adapter", lora=LORA)
    modules = 3 if base == "hf-phi3" else 5  # qkv_proj, o_proj, down_proj
    assert result.num_tensors == 2 * modules * 2  # A and B, each module, two layers
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = trained(tokens)
    hf_base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    before = _hf_logits(hf_base, tokens)
    peft_model = PeftModel.from_pretrained(hf_base, str(tmp_path / "adapter")).eval()
    got = _hf_logits(peft_model, tokens)
    assert (want - before).abs().max() > 1e-3  # the adapters changed the output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    export_merged(step_dir, tmp_path / "merged", lora=LORA)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    torch.testing.assert_close(_hf_logits(merged, tokens), want, atol=1e-5, rtol=1e-5)
    if model:
        assert (tmp_path / "merged" / "tokenizer.json").is_file()


def test_cli_exports_adapter_and_merge(api, tmp_path, tmp_path_factory):  # noqa: F811
    """`etrain export --adapter / --merge` on a LoRA job; a plain export says what to pass."""
    from service.auth import create_reporter_token
    from tests.integration.test_cli_export import etrain

    storage = {"storage": f"file://{tmp_path_factory.mktemp('store')}", "every_steps": 2}
    spec = make_spec("cli-lora", 1, {"strategy": "ddp"}, "adamw")
    spec["checkpoint"] = storage
    reply = api.post("/v1/jobs", json=spec)
    assert reply.status_code == 201, reply.text
    job_id = reply.json()["id"]
    root = f"{storage['storage']}/{job_id}/checkpoints"
    run(
        JobSpec.model_validate(spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(root)),
    )
    stores = api.app.state.runtime.stores
    token = create_reporter_token(
        stores.tokens, tenant_id=stores.jobs.get_job(job_id).tenant_id, job_id=job_id
    )
    items = [{"step": s, "uri": f"{root}/step_{s:08d}", "bytes": 1, "save_s": 0.1} for s in (2, 4)]
    r = api.post(
        f"/v1/jobs/{job_id}/telemetry",
        json={"checkpoints": items},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text

    plain = etrain("export", job_id, "--out", str(tmp_path / "plain"))
    assert plain.exit_code != 0 and "--adapter" in plain.output, plain.output
    adapter = etrain("export", job_id, "--adapter", "--out", str(tmp_path / "adapter"))
    assert adapter.exit_code == 0, adapter.output
    assert "LoRA adapter (peft format)" in adapter.output
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    merged = etrain("export", job_id, "--merge", "--step", "2", "--out", str(tmp_path / "m"))
    assert merged.exit_code == 0, merged.output
    assert json.loads((tmp_path / "m" / "etrain_export.json").read_text())["step"] == 2
    assert (tmp_path / "m" / "config.json").is_file()
