"""The denoising objective of Stable Diffusion-style image models (a UNet conditioned on a
text encoder's states, in a VAE's latent space): the math, independent of the world size.

An item is one image with its caption. Everything random about an item is drawn from a
generator seeded by the job's seed, the item's epoch and its index (:func:`draws`): the
VAE posterior's sample, the noise and the timestep. So a step's loss is the same on any
number of ranks, after a resize and after a resume, and an image seen again in a later
epoch gets new noise. Per item, with ``z`` the VAE latent times its scaling factor, ``ε``
the noise and ``t`` the timestep:

- the UNet sees ``add_noise(z, ε, t)`` (the scheduler's own) and the caption's states;
- its target is ``ε`` (``epsilon``) or ``get_velocity(z, ε, t)`` (``v_prediction``), as
  the scheduler's ``prediction_type`` says;
- the item's loss is the mean squared error over the latent's elements, in fp32; a step's
  loss is the mean over its global batch's items.

The VAE and the text encoder run without gradients (:class:`Frozen`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Mixes seed, epoch and index into one generator seed (63 bits).
_STRIDE = 1_000_003
_MASK = (1 << 63) - 1


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The generator seed of item ``index`` in ``epoch`` of a job seeded ``seed``."""
    return ((seed * _STRIDE + epoch) * _STRIDE + index) & _MASK


@dataclass(frozen=True)
class Draws:
    """What is random about one item: the VAE posterior's standard normal sample, the noise
    (both the latent's shape) and the timestep."""

    posterior: torch.Tensor
    noise: torch.Tensor
    timestep: int


def draws(seed: int, epoch: int, index: int, latent_shape, timesteps: int) -> Draws:
    """An item's :class:`Draws`, from its own generator on the CPU (the same on any
    device and rank)."""
    gen = torch.Generator().manual_seed(item_seed(seed, epoch, index))
    posterior = torch.randn(latent_shape, generator=gen)
    noise = torch.randn(latent_shape, generator=gen)
    timestep = int(torch.randint(0, timesteps, (1,), generator=gen))
    return Draws(posterior, noise, timestep)


@dataclass
class Frozen:
    """The parts that do not train: the VAE, the text encoder and the noise scheduler."""

    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    scheduler: object

    @property
    def prediction(self) -> str:
        return self.scheduler.config.prediction_type

    def latent_shape(self, resolution: int) -> tuple[int, int, int]:
        """The latent of one ``resolution``-square image: channels, height, width."""
        factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        side = resolution // factor
        return (self.vae.config.latent_channels, side, side)

    @torch.no_grad()
    def inputs(self, pixels, input_ids, items: list, *, seed: int):
        """``(noisy latents, timesteps, text states, targets)`` of a micro-batch: ``pixels``
        ``[B, 3, R, R]``, ``input_ids`` ``[B, L]``, ``items`` the sampler's ``(epoch,
        index)`` of each row."""
        shape = self.latent_shape(pixels.shape[-1])
        timesteps = self.scheduler.config.num_train_timesteps
        drawn = [draws(seed, epoch, index, shape, timesteps) for epoch, index in items]
        device = pixels.device
        posterior = self.vae.encode(pixels).latent_dist
        eps = torch.stack([d.posterior for d in drawn]).to(device)
        latents = (posterior.mean + posterior.std * eps) * self.vae.config.scaling_factor
        noise = torch.stack([d.noise for d in drawn]).to(device)
        t = torch.tensor([d.timestep for d in drawn], dtype=torch.long, device=device)
        noisy = self.scheduler.add_noise(latents, noise, t)
        if self.prediction == "v_prediction":
            target = self.scheduler.get_velocity(latents, noise, t)
        elif self.prediction == "epsilon":
            target = noise
        else:
            raise ValueError(
                f"the scheduler's prediction_type {self.prediction!r} is not trained here; "
                "epsilon and v_prediction are"
            )
        states = self.text_encoder(input_ids)[0]
        return noisy, t, states, target


def item_losses(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each item's mean squared error over its latent's elements, in fp32."""
    error = F.mse_loss(prediction.float(), target.float(), reduction="none")
    return error.flatten(1).mean(1)
