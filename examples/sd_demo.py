"""`make sd-demo`: LoRA fine-tuning of a Stable Diffusion-style pipeline on captioned images.

Runs on the embedded default in a few minutes on a CPU. Nothing can be downloaded here, so
the "pretrained" pipeline is a tiny one written with ``diffusers`` and ``transformers``
(UNet, VAE, CLIP text encoder, a BPE tokenizer trained with ``tokenizers``, DDPM
scheduler: the builder the tests use). The demo

1. writes the diffusers folder and 64 captioned pictures (a red, green, blue or yellow
   square or disc on grey, as PNG files beside a JSON Lines file) into the admin tenant's
   data area, ``.etrain-sd-demo/tenants/admin``;
2. starts ``etrain serve``, submits ``examples/sd-lora-tiny.yaml`` with ``model.hf`` and
   ``data.path`` pointed there, and follows it to the end;
3. prints the held-out denoising loss (the same images, noise and timesteps at every
   evaluation, so the points compare), exports the adapter in diffusers' format and
   renders an image with it through diffusers' own pipeline (``examples/sd_generate.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from examples.demo import serving, tune_and_export  # noqa: E402
from examples.sd_generate import render  # noqa: E402
from tests.support.diffusion_fixtures import make_tiny_sd  # noqa: E402

SPEC = ROOT / "examples" / "sd-lora-tiny.yaml"
DATA_DIR = ROOT / ".etrain-sd-demo"
AREA = DATA_DIR / "tenants" / "admin"
PORT = int(os.environ.get("DEMO_PORT", "8803"))
URL = f"http://127.0.0.1:{PORT}"
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (40, 60, 220),
    "yellow": (230, 210, 40),
}


def write_images(folder: Path, n: int) -> Path:
    """``n`` pictures (32 x 32 PNG) and ``shapes.jsonl`` naming each with its caption."""
    from PIL import Image, ImageDraw

    (folder / "images").mkdir(parents=True)
    rows = []
    for i in range(n):
        colour = list(COLOURS)[i % 4]
        shape = "square" if (i // 4) % 2 == 0 else "disc"
        image = Image.new("RGB", (32, 32), (128, 128, 128))
        draw = ImageDraw.Draw(image)
        box = (6 + i % 3, 6 + i % 5, 25 + i % 3, 25 + i % 5)
        (draw.rectangle if shape == "square" else draw.ellipse)(box, fill=COLOURS[colour])
        image.save(folder / "images" / f"{i:03d}.png")
        rows.append({"image": f"images/{i:03d}.png", "caption": f"a {colour} {shape}"})
    path = folder / "shapes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> int:
    """Build the inputs, serve, tune, report; non-zero unless the held-out loss fell."""
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    AREA.mkdir(parents=True)
    folder = AREA / "tiny-sd"
    make_tiny_sd(folder)
    shutil.rmtree(folder / "tokenizer-src", ignore_errors=True)  # the builder's scratch copy
    images = write_images(AREA, 64)
    with serving(DATA_DIR, PORT, dashboard_port="8868", gcs_port="6393") as (serve, env):
        return run(serve, env, folder, images)


def run(serve: subprocess.Popen, env: dict, folder: Path, images: Path) -> int:
    """Submit the spec, follow it, export the adapter, render with it, report."""
    job_id, job, points, out = tune_and_export(SPEC, folder, images, DATA_DIR, URL, serve, env)
    picture = DATA_DIR / "export" / "a-red-disc.png"
    size = yaml.safe_load(SPEC.read_text())["diffusion"]["resolution"]  # as trained
    render(str(folder), str(out), "a red disc", steps=10, seed=0, size=size).save(picture)
    evals = [(p["step"], p["eval_loss"]) for p in points if p.get("eval_loss") is not None]
    first, last = points[:10], points[-10:]
    print("\n=== Stable Diffusion LoRA demo summary ===")
    print(f"job              {job_id}  {job['status']}")
    print(f"loss             {sum(p['loss'] for p in first) / len(first):.4f} (first 10 steps)")
    print(f"loss             {sum(p['loss'] for p in last) / len(last):.4f} (last 10 steps)")
    print(f"images/s         {sum(p['samples_per_s'] for p in last) / len(last):.1f}")
    print("held-out loss    " + ", ".join(f"{v:.4f} at step {s}" for s, v in evals))
    print(f"adapter          {out} (diffusers' format: pipeline.load_lora_weights)")
    print(f"rendered         {picture} ('a red disc', 10 steps, with the adapter)")
    fell = len(evals) >= 2 and evals[-1][1] < evals[0][1]
    return 0 if job["status"] == "SUCCEEDED" and fell else 1


if __name__ == "__main__":
    sys.exit(main())
