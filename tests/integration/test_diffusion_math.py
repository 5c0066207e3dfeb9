"""The denoising objective's math on a tiny Stable Diffusion pipeline built here: a
micro-batch's per-image losses equal a hand-written reference that calls diffusers itself
(the VAE posterior's ``sample`` with the image's own generator, ``DDPMScheduler.add_noise``
or ``get_velocity``, the UNet's forward) within 1e-6, for epsilon and v-prediction; and
they do not depend on how the batch is split (ranks, micro-batches)."""

from __future__ import annotations

import pytest
import torch

from tests.support.diffusion_fixtures import TEXT_LENGTH, make_tiny_sd
from workers.objectives.diffusion import Frozen, item_losses, item_seed

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

SEED, RESOLUTION = 7, 32
ITEMS = [(0, 3), (0, 11), (1, 3), (2, 5)]  # (epoch, index): image 3 seen in two epochs


@pytest.fixture(scope="module", params=["epsilon", "v_prediction"])
def pipe(request, tmp_path_factory):
    return make_tiny_sd(tmp_path_factory.mktemp("sd"), prediction=request.param)


def _batch(pipe):
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(len(ITEMS), 3, RESOLUTION, RESOLUTION, generator=gen) * 2 - 1
    captions = ["a red fox", "a lazy dog", "a red fox", "hello world"]
    ids = pipe.tokenizer(
        captions, padding="max_length", max_length=TEXT_LENGTH, return_tensors="pt"
    ).input_ids
    return pixels, ids


def _reference(pipe, pixels, ids) -> torch.Tensor:
    """Each image alone, through diffusers' own calls, its draws from its own generator in
    the documented order: the posterior's sample, the noise, the timestep."""
    losses = []
    sched = pipe.scheduler
    for i, (epoch, index) in enumerate(ITEMS):
        gen = torch.Generator().manual_seed(item_seed(SEED, epoch, index))
        with torch.no_grad():
            latents = pipe.vae.encode(pixels[i : i + 1]).latent_dist.sample(generator=gen)
            latents = latents * pipe.vae.config.scaling_factor
            noise = torch.randn(latents.shape[1:], generator=gen)[None]
            t = torch.randint(0, sched.config.num_train_timesteps, (1,), generator=gen)
            states = pipe.text_encoder(ids[i : i + 1])[0]
        noisy = sched.add_noise(latents, noise, t)
        target = noise if sched.config.prediction_type == "epsilon" else None
        if target is None:
            target = sched.get_velocity(latents, noise, t)
        prediction = pipe.unet(noisy, t, encoder_hidden_states=states).sample
        losses.append(((prediction - target) ** 2).mean())
    return torch.stack(losses)


def _ours(pipe, pixels, ids, rows) -> torch.Tensor:
    frozen = Frozen(pipe.vae, pipe.text_encoder, pipe.scheduler)
    noisy, t, states, target = frozen.inputs(
        pixels[rows], ids[rows], [ITEMS[r] for r in rows], seed=SEED
    )
    return item_losses(pipe.unet(noisy, t, encoder_hidden_states=states).sample, target)


def test_the_losses_equal_diffusers_own_steps(pipe):
    pixels, ids = _batch(pipe)
    want = _reference(pipe, pixels, ids)
    got = _ours(pipe, pixels, ids, list(range(len(ITEMS))))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got[0] != got[2]  # the same image in another epoch gets other noise


def test_the_losses_do_not_depend_on_the_split(pipe):
    pixels, ids = _batch(pipe)
    whole = _ours(pipe, pixels, ids, [0, 1, 2, 3])
    split = torch.cat([_ours(pipe, pixels, ids, [0, 1]), _ours(pipe, pixels, ids, [2, 3])])
    alone = torch.cat([_ours(pipe, pixels, ids, [r]) for r in range(4)])
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(alone, whole, rtol=1e-6, atol=1e-7)
