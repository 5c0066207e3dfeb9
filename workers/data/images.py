"""Images with captions, for image models: rows of a jsonl file (``image``: a path relative
to the file's folder) or a parquet file (``image``: the image's bytes, or a struct with a
``bytes`` field as Hugging Face ``datasets`` writes an Image column), each with a caption.

Every image is untrusted input. A path is relative: no absolute path, no ``..``, opened
beneath the job's roots with no link out, regular files only, at most
:data:`MAX_IMAGE_BYTES` read. An encoded image that decodes to more than
:data:`MAX_IMAGE_PIXELS` is refused before it is decoded (Pillow reads the size from the
header), so a small file cannot expand into gigabytes. A file that is not an image is a
ValueError naming the file and row. Images are made RGB, resized so the shorter side is
``resolution`` (bicubic), centre-cropped to a square and scaled to [-1, 1], with Pillow and
numpy.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from workers.data.formats import field
from workers.data.items import EachItemCountsOnce
from workers.storage.confine import Roots, read_bounded

MAX_IMAGE_BYTES = 32 << 20
MAX_IMAGE_PIXELS = 64 << 20  # 64 megapixels (8192 x 8192)


@dataclass(frozen=True)
class ImageRow:
    """One row: where it is (file, row number), the image (a path or the bytes) and its
    caption."""

    path: str
    row: int
    image: str | bytes
    caption: str

    @property
    def where(self) -> str:
        return f"{self.path!r} row {self.row}"


def image_rows(
    rows: Iterable[tuple[int, object]],
    path: str,
    *,
    image_field: str = "image",
    caption_field: str = "caption",
    section: str = "data",
) -> list[ImageRow]:
    """The :class:`ImageRow` of each ``(row, record)`` of ``path`` (from
    :func:`workers.data.formats.read_rows`); a bad row is a ValueError naming it."""
    out = []
    for row, record in rows:
        caption = field(path, row, record, caption_field, str, "caption", section=section)
        image = field(path, row, record, image_field, (str, bytes, dict), "image", section=section)
        where = f"{section}.path {path!r} row {row}"
        if isinstance(image, dict):  # datasets' Image feature: {"bytes": ..., "path": ...}
            image = image.get("bytes")
            if not isinstance(image, bytes):
                raise ValueError(f"{where}: field {image_field!r} holds no image bytes")
        elif isinstance(image, str):
            image = relative_image_path(image, where=where)
        out.append(ImageRow(path, row, image, caption))
    if not out:
        raise ValueError(f"{section}.path {path!r} holds no rows; it needs at least one image")
    return out


def relative_image_path(name: str, *, where: str) -> str:
    """``name`` if it is a relative path inside the data file's folder; else a ValueError."""
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith("/") or ".." in parts or "\x00" in name:
        raise ValueError(
            f"{where}: image {name!r} must be a path relative to the data file's folder, "
            "without '..'"
        )
    return name


def image_bytes(row: ImageRow, roots: Roots, *, section: str = "data") -> bytes:
    """The encoded image of ``row``: its bytes, or its file (beside the data file) read
    bounded beneath ``roots``."""
    if isinstance(row.image, bytes):
        if len(row.image) > MAX_IMAGE_BYTES:
            raise ValueError(
                f"{section}.path {row.where}: the image is {len(row.image)} bytes, over "
                f"{MAX_IMAGE_BYTES}"
            )
        return row.image
    path = os.path.join(os.path.dirname(row.path), row.image)
    try:
        return read_bounded(path, roots, MAX_IMAGE_BYTES, what=f"{section}.path {row.where}")
    except FileNotFoundError:
        raise ValueError(
            f"{section}.path {row.where}: image {row.image!r} does not exist beside the data file"
        ) from None


def header_pixels(data: bytes, *, where: str) -> int:
    """The pixels ``data`` would decode to, read from its header alone (nothing decoded);
    a ValueError naming ``where`` when Pillow does not know it as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ValueError(f"{where}: not an image Pillow can read ({type(e).__name__})") from None
    return width * height


def decode(data: bytes, *, where: str):
    """An RGB Pillow image of ``data``; a ValueError naming ``where`` when it is not an
    image Pillow reads, or is larger than :data:`MAX_IMAGE_PIXELS`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ValueError(
                    f"{where}: the image is {width} x {height} pixels, over "
                    f"{MAX_IMAGE_PIXELS} pixels"
                )
            image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"{where}: not an image Pillow can read ({type(e).__name__})") from None
    return image.convert("RGB")


def to_pixels(image, resolution: int) -> np.ndarray:
    """``image`` resized (shorter side ``resolution``, bicubic), centre-cropped to
    ``resolution`` square, as float32 ``[3, resolution, resolution]`` in [-1, 1]."""
    from PIL import Image

    width, height = image.size
    scale = resolution / min(width, height)
    size = (max(resolution, round(width * scale)), max(resolution, round(height * scale)))
    image = image.resize(size, Image.Resampling.BICUBIC)
    left, top = (size[0] - resolution) // 2, (size[1] - resolution) // 2
    image = image.crop((left, top, left + resolution, top + resolution))
    array = np.asarray(image, dtype=np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def caption_ids(rows: list[ImageRow], tokenizer, max_length: int, *, section: str = "data"):
    """The token ids of each row's caption, padded to ``max_length`` (the text encoder's
    positions) as int64 ``[rows, max_length]``; a caption longer than that is a ValueError
    naming its file and row (it would be cut silently otherwise)."""
    ids = tokenizer([row.caption for row in rows], padding="max_length", max_length=max_length)
    out = np.zeros((len(rows), max_length), dtype=np.int64)
    for i, (row, seq) in enumerate(zip(rows, ids["input_ids"], strict=True)):
        if len(seq) > max_length:
            raise ValueError(
                f"{section}.path {row.where}: the caption is {len(seq)} tokens, over the text "
                f"encoder's {max_length}; shorten it"
            )
        out[i] = seq
    return out


class ImageCaptions(EachItemCountsOnce):
    """A training (or evaluation) set of images with captions: item ``i`` is ``(pixels
    [3, R, R] float32 in [-1, 1], caption ids [L] int64)`` as numpy arrays, its image read
    (bounded, beneath ``roots``) and decoded when it is asked for.

    Every image counts once (``masked``, ``counted``): a step's loss is the mean over its
    global batch's images, whatever the world size and micro-batching."""

    def __init__(self, rows: list[ImageRow], ids, *, resolution: int, roots: Roots, section: str):
        self.rows, self.ids, self.resolution = rows, ids, resolution
        self.roots, self.section = roots, section

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        row = self.rows[index]
        data = image_bytes(row, self.roots, section=self.section)
        image = decode(data, where=f"{self.section}.path {row.where}")
        return to_pixels(image, self.resolution), self.ids[index]
