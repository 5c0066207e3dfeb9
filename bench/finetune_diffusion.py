"""Stable Diffusion LoRA (``objective: diffusion``): images per second and memory by part,
with the latent cache off and on, in one run.

    python bench/finetune_diffusion.py [--steps 20] [--images 64] [--resolution 64] [--busy N]

One rank in this process, the tests' tiny pipeline (diffusers UNet with 2 levels, VAE, CLIP
text encoder), rank-8 LoRA on the UNet's attention, AdamW, global batch 8, micro-batch 4,
``--images`` captioned pictures beside a jsonl file. Rows, back to back: the latent cache
off (each step encodes its images with the VAE and its captions with the text encoder),
then on (the node cache's entry built inside the run's time, then mapped), then on again
(the next job: the entry reused). Images/s is the global batch over the median step time
(steps 3..N); run s is the whole job, set-up and cache included. Memory is what the rank
measured at its first step: the trained UNet's parameters, the adapters' gradients and
optimizer state, the VAE and text encoder beside it, activations. The ratio is against
the cache-off row of the same run. The loss columns show the rows train on the same draws.
``--busy N`` keeps N CPU-bound processes running beside every row (a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "vae_bytes",
    "text_encoder_bytes",
    "activations_bytes",
)


def write_inputs(root: Path, images: int) -> tuple[Path, Path]:
    from PIL import Image

    from tests.support.diffusion_fixtures import make_tiny_sd

    make_tiny_sd(root / "sd")
    (root / "img").mkdir()
    rows = []
    for i in range(images):
        colour = ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)
        Image.new("RGB", (80, 72), colour).save(root / "img" / f"{i}.png")
        rows.append({"image": f"img/{i}.png", "caption": f"a picture number {i % 10}"})
    data = root / "images.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "sd", data


def run_row(folder: Path, data: Path, *, cache: bool, steps: int, resolution: int) -> dict:
    import torch

    from workers.spec import JobSpec
    from workers.train_loop import RunEnv, run

    spec = JobSpec.model_validate(
        {
            "name": "bench-sd",
            "objective": "diffusion",
            "diffusion": {"resolution": resolution, "cache_latents": cache},
            "model": {"hf": str(folder), "lora": {"rank": 8, "alpha": 8}},
            "data": {"source": "jsonl", "path": str(data), "shape": "image"},
            "train": {
                "steps": steps,
                "global_batch_size": 8,
                "micro_batch_size": 4,
                "optimizer": "adamw",
                "lr": 1e-3,
            },
        }
    )
    t0 = time.perf_counter()
    result = run(spec, RunEnv(0, 1, torch.device("cpu")))
    wall = time.perf_counter() - t0
    step = statistics.median(result.step_times[2:])
    memory = result.memory[0] if result.memory else {}
    return {
        "images_per_s": 8 / step,
        "step_s": step,
        "wall_s": wall,
        "loss_1": result.losses[1],
        "loss_last": result.losses[steps],
        **{k: memory.get(k, 0) for k in PARTS},
    }


ROWS = (("cache off", False), ("cache on", True), ("cache on, again", True))


def diffusion_table(
    *, steps: int = 20, images: int = 64, resolution: int = 64, busy: int = 0
) -> dict:
    """Run the rows in this process (``busy`` CPU-bound processes beside them), print the
    table; the rows by name."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        before = os.environ.get("ETRAIN_DATA_CACHE")
        os.environ["ETRAIN_DATA_CACHE"] = str(Path(tmp) / "cache")
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)
        ]
        try:
            folder, data = write_inputs(Path(tmp), images)
            rows = {
                name: run_row(folder, data, cache=cache, steps=steps, resolution=resolution)
                for name, cache in ROWS
            }
        finally:
            for burner in burners:
                burner.kill()
            if before is None:
                os.environ.pop("ETRAIN_DATA_CACHE", None)
            else:
                os.environ["ETRAIN_DATA_CACHE"] = before
    base = rows["cache off"]["images_per_s"]
    mib = 1 << 20
    print(
        f"\ntiny SD, {resolution} px, {images} images, global batch 8, micro-batch 4, "
        f"AdamW, rank-8 LoRA, one rank; median step of steps 3..{steps}; "
        f"{busy} CPU-bound processes beside"
    )
    print(
        "| row | images/s | x off | step s | run s | UNet + adapters MiB | grads | optim "
        "| VAE | text enc. | activ | loss step 1 | loss last |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['images_per_s']:.1f} | {r['images_per_s'] / base:.2f} "
            f"| {r['step_s']:.3f} | {r['wall_s']:.1f} | {r['params_bytes'] / mib:.2f} "
            f"| {r['grads_bytes'] / mib:.3f} | {r['optimizer_bytes'] / mib:.3f} "
            f"| {r['vae_bytes'] / mib:.2f} | {r['text_encoder_bytes'] / mib:.2f} "
            f"| {r['activations_bytes'] / mib:.2f} "
            f"| {r['loss_1']:.5f} | {r['loss_last']:.5f} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside the rows")
    args = ap.parse_args()
    diffusion_table(
        steps=args.steps, images=args.images, resolution=args.resolution, busy=args.busy
    )


if __name__ == "__main__":
    main()
