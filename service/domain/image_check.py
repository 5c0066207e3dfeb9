"""Submit-time checks of ``objective: diffusion``: the diffusers folder ``model.hf`` and the
head of its images with captions, torch-free and bounded.

The folder must hold every part the workers build (``model_index.json``, ``unet/``,
``vae/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/``; safetensors weights; the SD
1.x/2.x classes), read the way the workers read it
(:func:`workers.models.diffusers_folder.layout_error`). Of the data, the first
:data:`MAX_IMAGE_ROWS` rows are read: the fields, each image (beside a jsonl file, opened
beneath the tenant's roots, at most 32 MiB, no more than :data:`MAX_CHECKED_BYTES` in all)
decoded with Pillow (:data:`MAX_CHECKED_PIXELS` decoded in all), and each caption counted
in tokens against the text encoder's positions by the folder's own tokenizer, loaded as
the workers load it (``tokenizer.json``, or CLIP's ``vocab.json`` and ``merges.txt``).
Each problem names the file and row.
"""

from __future__ import annotations

import itertools
import os

from workers.data.images import (
    ImageRow,
    caption_ids,
    decode,
    header_pixels,
    image_bytes,
    image_rows,
)
from workers.models.diffusers_folder import (
    DiffusionShape,
    diffusion_shape,
    layout_error,
    load_tokenizer,
    read_json,
)
from workers.storage.confine import Roots

MAX_IMAGE_ROWS = 64
MAX_CHECKED_BYTES = 64 << 20
# Pixels decoded in all: a small file may hold a 64-megapixel picture of one colour, so the
# encoded bytes alone do not bound the memory and time of the check.
MAX_CHECKED_PIXELS = 64 << 20


def diffusion_shape_of(spec, roots: Roots) -> DiffusionShape | None:
    """The shape of ``model.hf``, a diffusers folder the workers train (None when the
    service cannot see it: the workers read it, and name what is missing); a ValueError
    says why it cannot be trained."""
    folder = spec.model.hf.removeprefix("file://")
    if not os.path.exists(folder):
        return None
    error = layout_error(folder, roots)
    if error:
        raise ValueError(error)
    try:
        return diffusion_shape(folder, roots)
    except (OSError, ValueError) as e:
        raise ValueError(f"model.hf {folder!r}: {e}") from None


def check_image_rows(path: str, rows, data, *, spec, roots: Roots) -> None:
    """ValueError naming ``path`` and the row when one of the first rows of ``rows``
    (``(row, record)`` pairs) lacks a field, holds no image Pillow reads, or has a caption
    longer than the text encoder takes."""
    at = data.section
    head = list(itertools.islice(rows, MAX_IMAGE_ROWS))
    found = image_rows(
        head, path, image_field=data.image_field, caption_field=data.caption_field, section=at
    )
    checked = pixels = 0
    for row in found:
        if checked > MAX_CHECKED_BYTES:
            break
        encoded = image_bytes(row, roots, section=at)
        checked += len(encoded)
        where = f"{at}.path {row.where}"
        pixels += header_pixels(encoded, where=where)
        if pixels > MAX_CHECKED_PIXELS:
            break  # the workers decode the rest, and name a bad one
        decode(encoded, where=where)
    _check_captions(found, spec.model.hf.removeprefix("file://"), roots, at)


def _check_captions(found: list[ImageRow], folder: str, roots: Roots, at: str) -> None:
    try:  # only the parts captions need: the folder's layout was checked on its own
        tokenizer = load_tokenizer(folder, roots)
        length = read_json(folder, "text_encoder/config.json", roots)
        length = length.get("max_position_embeddings")
    except (OSError, ValueError):
        return  # the folder's own refusal says why
    if isinstance(length, int):
        caption_ids(found, tokenizer, length, section=at)  # the workers' own count
