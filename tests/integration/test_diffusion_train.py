"""Objective diffusion on a tiny Stable Diffusion folder built here, trained with LoRA on
images with captions: the first step's loss equals a hand-written single process that calls
diffusers and peft themselves (1e-6); each step on 2 ranks (DDP, FSDP ZeRO-2 / ZeRO-3; SGD
and AdamW) equals one process's (1e-5); a job resumed from its checkpoint on another world
size repeats the uninterrupted run bit for bit (the per-image noise is the same)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.support.diffusion_fixtures import make_tiny_sd
from tests.support.local_launch import LocalJob, run_local
from workers.data.images import decode, to_pixels
from workers.data.sampler import GlobalBatchSampler
from workers.objectives.diffusion import item_losses, item_seed
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS, RESOLUTION, IMAGES, SEED = 4, 32, 12, 3
OPTIMIZERS = {"sgd": {"optimizer": "sgd", "lr": 0.5}, "adamw": {"optimizer": "adamw", "lr": 1e-2}}
ROWS = {  # name: (parallelism, optimizer); ddp with AdamW is the resumed job's
    "ddp-sgd": ({"strategy": "ddp"}, "sgd"),
    "fsdp2-adamw": ({"strategy": "fsdp", "fsdp": {"zero_stage": 2}}, "adamw"),
    "fsdp3-sgd": ({"strategy": "fsdp", "fsdp": {"zero_stage": 3}}, "sgd"),
    "deepspeed2-adamw": ({"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}, "adamw"),
    "ddp-adamw": ({"strategy": "ddp"}, "adamw"),
}
CAPTIONS = ["a red fox", "a lazy dog", "hello world", "the quick brown fox"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The tiny pipeline and 12 images (odd sizes, so resize and crop both act) with
    captions in a jsonl file beside them."""
    root = tmp_path_factory.mktemp("sd-train")
    make_tiny_sd(root / "sd")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    with open(root / "images.jsonl", "w") as f:
        for i in range(IMAGES):
            pixels = rng.integers(0, 256, (40 + 3 * i, 36, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / f"{i}.png")
            f.write(json.dumps({"image": f"images/{i}.png", "caption": CAPTIONS[i % 4]}) + "\n")
    return root


def make_spec(root, row: str, workers: int) -> dict:
    par, opt = ROWS[row]
    spec = {
        "name": f"sd-{row}",
        "objective": "diffusion",
        "diffusion": {"resolution": RESOLUTION},
        "model": {"hf": str(root / "sd"), "lora": {"rank": 4, "alpha": 4}},
        "data": {"source": "jsonl", "path": str(root / "images.jsonl"), "shape": "image"},
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": par if workers > 1 else {"strategy": "ddp"},
        "train": {"steps": STEPS, "global_batch_size": 4, "micro_batch_size": 1, "seed": SEED}
        | OPTIMIZERS[opt],
        "checkpoint": {"every_steps": 2, "keep_last": 2},
    }
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


@pytest.fixture(scope="module")
def references(root) -> dict:
    out = {}
    for opt in OPTIMIZERS:
        row = next(r for r, (_, o) in ROWS.items() if o == opt)
        spec = JobSpec.model_validate(make_spec(root, row, 1))
        out[opt] = run(spec, RunEnv(0, 1, torch.device("cpu"), measure_memory=False))
    return out


def test_first_step_equals_diffusers_and_peft_by_hand(root, references):
    """The sampler's first global batch, each image through Pillow, the folder's own
    pipeline (diffusers' from_pretrained), peft's gaussian LoRA init under the job's seed,
    the VAE's posterior sample, the noise and the timestep from the image's generator."""
    from diffusers import DDPMScheduler, StableDiffusionPipeline
    from peft import LoraConfig

    pipe = StableDiffusionPipeline.from_pretrained(str(root / "sd"), safety_checker=None)
    sched = DDPMScheduler.from_config(pipe.scheduler.config)
    torch.manual_seed(SEED)
    pipe.unet.add_adapter(
        LoraConfig(
            r=4,
            lora_alpha=4,
            init_lora_weights="gaussian",
            target_modules=["to_q", "to_k", "to_v", "to_out.0"],
        )
    )
    items = GlobalBatchSampler(IMAGES, seed=SEED).next_global_batch(4)
    rows = [json.loads(line) for line in (root / "images.jsonl").read_text().splitlines()]
    losses = []
    for epoch, index in items:
        data = (root / rows[index]["image"]).read_bytes()
        pixels = torch.from_numpy(to_pixels(decode(data, where="test"), RESOLUTION))[None]
        ids = pipe.tokenizer(
            rows[index]["caption"], padding="max_length", max_length=32, return_tensors="pt"
        ).input_ids
        gen = torch.Generator().manual_seed(item_seed(SEED, epoch, index))
        with torch.no_grad():
            latents = pipe.vae.encode(pixels).latent_dist.sample(generator=gen)
            latents = latents * pipe.vae.config.scaling_factor
            noise = torch.randn(latents.shape[1:], generator=gen)[None]
            t = torch.randint(0, sched.config.num_train_timesteps, (1,), generator=gen)
            states = pipe.text_encoder(ids)[0]
            prediction = pipe.unet(sched.add_noise(latents, noise, t), t, states).sample
        losses.append(item_losses(prediction, noise))
    want = float(torch.cat(losses).mean())
    for result in references.values():
        assert result.losses[1] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("mode", "on"), [("none", False), ("full", True), ("selective", True)])
def test_activation_checkpointing_is_the_unets_gradient_checkpointing(root, mode, on):
    from workers.objectives.diffusion import place

    raw = make_spec(root, "ddp-sgd", 1)
    raw["model"]["activation_checkpointing"] = mode
    (unet,) = place(JobSpec.model_validate(raw), RunEnv(0, 1, torch.device("cpu")), None)
    assert unet.is_gradient_checkpointing == on


def test_under_bf16_the_frozen_unet_is_held_in_bf16_with_the_same_steps(root, monkeypatch):
    """train.precision bf16: the UNet's frozen linear and convolution layers are stored in
    bf16 (autocast computes them in bf16 anyway), so the steps equal those of a run that
    keeps them in fp32 bit for bit; the measured parameter bytes are the plan's exactly."""
    import workers.objectives.diffusion as objective
    from service.planner.diffusion import planned_bytes
    from workers.models.diffusers_folder import diffusion_shape
    from workers.storage.confine import UNCONFINED

    raw = make_spec(root, "ddp-adamw", 1)
    raw["train"] |= {"precision": "bf16", "steps": 2}
    spec = JobSpec.model_validate(raw)
    held = run(spec, RunEnv(0, 1, torch.device("cpu")))
    monkeypatch.setattr(objective, "hold_frozen_linears_in", lambda *a, **k: 0)
    fp32 = run(spec, RunEnv(0, 1, torch.device("cpu")))
    assert held.losses == fp32.losses
    shape = diffusion_shape(str(root / "sd"), UNCONFINED)
    assert held.memory[0]["params_bytes"] == planned_bytes(spec, shape, 1)["params_bytes"]
    saved = fp32.memory[0]["params_bytes"] - held.memory[0]["params_bytes"]
    assert saved == 2 * shape.unet_matmul_params > 0.99 * 2 * shape.unet_params


@pytest.fixture(scope="module")
def results(root):
    rows = [row for row in ROWS if row != "ddp-adamw"]
    jobs = [LocalJob(row, make_spec(root, row, 2), measure_memory=row == "ddp-sgd") for row in rows]
    spec, ckpt = make_spec(root, "ddp-adamw", 2), str(root / "ckpt")
    jobs.append(LocalJob("save", spec, ckpt, stop_at=2))
    return run_local(jobs, world_size=2)


@pytest.mark.parametrize("row", [row for row in ROWS if row != "ddp-adamw"])
def test_two_ranks_equal_one_process(results, references, row):
    got, want = results[row], references[ROWS[row][1]]
    assert sorted(got.losses) == list(range(1, STEPS + 1))
    for step, loss in want.losses.items():
        assert got.losses[step] == pytest.approx(loss, abs=1e-5), step
    assert len({round(v, 4) for v in want.losses.values()}) == STEPS  # it trains


def test_the_first_step_measures_each_frozen_part(root, results):
    """The memory report names the VAE and the text encoder, each whole on every rank."""
    from workers.models.diffusers_folder import diffusion_shape
    from workers.storage.confine import UNCONFINED

    shape = diffusion_shape(str(root / "sd"), UNCONFINED)
    for rank in results["ddp-sgd"].memory:
        assert rank["vae_bytes"] == 4 * shape.vae_params
        assert rank["text_encoder_bytes"] == 4 * shape.text_encoder_params
        assert "reference_bytes" not in rank


@pytest.fixture(scope="module")
def resumed(root, results):
    """The two-rank job saved at step 2, resumed by one process to step 4."""
    from workers.storage.location import locate

    spec = JobSpec.model_validate(make_spec(root, "ddp-adamw", 1))
    env = RunEnv(0, 1, torch.device("cpu"), checkpoints=locate(str(root / "ckpt")))
    return run(spec, env)


def test_resumed_on_one_process_repeats_the_uninterrupted_run(resumed, results, references):
    """A job saved at step 2 by 2 ranks (DDP, AdamW) and resumed by one process: steps 1-2
    and 3-4 are the uninterrupted run's (the same images with the same noise, timesteps
    and posterior samples, whatever the world size)."""
    assert resumed.resumed_from == 2
    uninterrupted = references["adamw"]
    saved = results["save"]
    for step in (1, 2):
        assert saved.losses[step] == pytest.approx(uninterrupted.losses[step], abs=1e-5)
    for step in (3, 4):
        assert resumed.losses[step] == pytest.approx(uninterrupted.losses[step], abs=1e-5)


def _unet_inputs(unet):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, RESOLUTION // 2, RESOLUTION // 2, generator=gen)
    states = torch.randn(2, 32, 32, generator=gen)
    return x, torch.tensor([10, 700]), states


def test_exported_adapter_and_merged_pipeline_load_in_diffusers(root, resumed, tmp_path):
    """The last checkpoint's adapters, exported, load with load_lora_weights (and merged,
    with from_pretrained), and the UNet computes what etrain's trained UNet computes."""
    from diffusers import StableDiffusionPipeline

    from workers.checkpoint.export_lora import export_adapter, export_merged

    lora = make_spec(root, "ddp-adamw", 1)["model"]["lora"]
    ckpt = max((root / "ckpt").glob("step_*"), key=lambda p: int(p.name.split("_")[-1]))
    assert ckpt.name.endswith("4")
    trained = resumed.model.eval()
    x, t, states = _unet_inputs(trained)
    with torch.no_grad():
        want = trained(x, t, encoder_hidden_states=states).sample
    export_adapter(ckpt, tmp_path / "adapter", lora=lora)
    pipe = StableDiffusionPipeline.from_pretrained(str(root / "sd"), safety_checker=None)
    with torch.no_grad():
        base = pipe.unet(x, t, encoder_hidden_states=states).sample
        pipe.load_lora_weights(str(tmp_path / "adapter"))
        got = pipe.unet(x, t, encoder_hidden_states=states).sample
    assert (base - want).abs().max() > 1e-3  # the adapters changed the UNet
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    result = export_merged(ckpt, tmp_path / "merged", lora=lora)
    assert result.merged and result.step == 4
    merged = StableDiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
    with torch.no_grad():
        fused = merged.unet(x, t, encoder_hidden_states=states).sample
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)


def test_cached_latents_train_as_the_images_do(root, references, monkeypatch, tmp_path):
    """diffusion.cache_latents: the node cache's posteriors and text states give the same
    steps as encoding each micro-batch (1e-5), the workers hold no VAE or text encoder, and
    a second job reuses the entry without encoding again."""
    from workers.objectives.diffusion import dataset

    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path))
    raw = make_spec(root, "ddp-adamw", 1)
    raw["diffusion"]["cache_latents"] = True
    spec = JobSpec.model_validate(raw)
    cached = run(spec, RunEnv(0, 1, torch.device("cpu"), measure_memory=False))
    for step, loss in references["adamw"].losses.items():
        assert cached.losses[step] == pytest.approx(loss, abs=1e-5), step
    (entry,) = [p for p in tmp_path.rglob("latents-*") if p.is_dir()]
    made = (entry / "mean.npy").stat().st_mtime_ns
    again = dataset(spec, spec.data, seed=0)
    assert len(again) == IMAGES and (entry / "mean.npy").stat().st_mtime_ns == made
    kind, mean, std, states = again[0]
    assert kind == "latent" and mean.shape == (4, RESOLUTION // 2, RESOLUTION // 2)
    assert states.shape == (32, 32) and (std > 0).all()


def test_sigkilled_job_on_ray_resumes_with_the_same_noise(
    root, references, run_job, telemetry_sink, tmp_path
):
    """A real Ray job (2 workers, DDP, AdamW, latents cached by the node's first worker
    while the other waits on the lock), rank 1 SIGKILLed after step 3 (checkpoint at 2):
    restored at step 2, and every step's loss is the one-process uninterrupted run's
    (1e-5), so steps 3-4 drew the same images, noise, timesteps and posterior samples."""
    from tests.support.faults import run_killed_once

    spec = make_spec(root, "ddp-adamw", 2)
    spec["diffusion"]["cache_latents"] = True
    env = {"ETRAIN_DATA_CACHE": str(tmp_path / "cache")}
    job_id = run_killed_once(
        run_job, telemetry_sink, spec=spec, job="sd-kill", tmp_path=tmp_path / "ckpt", env=env
    )
    losses = telemetry_sink.losses(job_id)
    want = references["adamw"].losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in want.items():
        assert losses[step] == pytest.approx(loss, abs=1e-5), step
    assert len(list((tmp_path / "cache").rglob("latents-*/mean.npy"))) == 1
