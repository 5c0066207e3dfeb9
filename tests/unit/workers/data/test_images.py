"""Images with captions: rows of jsonl (paths beside the file) and parquet (bytes), read
bounded and confined, decoded with Pillow and shaped to the model's resolution; each bad
image is refused naming its file and row."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from workers.data import images
from workers.data.formats import read_rows
from workers.data.images import decode, image_bytes, image_rows, to_pixels
from workers.storage.confine import ConfinementError, Roots


def png(width: int, height: int, colour=(255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


def two_halves(width: int, height: int) -> Image.Image:
    """Left half red, right half blue."""
    image = Image.new("RGB", (width, height), (255, 0, 0))
    image.paste((0, 0, 255), (width // 2, 0, width, height))
    return image


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png(40, 20))
    two_halves(64, 32).save(tmp_path / "img" / "b.png")
    (tmp_path / "img" / "notes.txt").write_text("not an image")
    return tmp_path


def rows_of(folder, records) -> tuple[str, list]:
    path = folder / "captions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path), image_rows(read_rows(str(path), "jsonl"), str(path))


def test_jsonl_images_are_read_beside_the_file_and_shaped(folder):
    _, rows = rows_of(folder, [{"image": "img/a.png", "caption": "red"}])
    roots = Roots.of([str(folder)], [])
    pixels = to_pixels(decode(image_bytes(rows[0], roots), where="a"), 16)
    assert pixels.shape == (3, 16, 16) and pixels.dtype == np.float32
    assert np.allclose(pixels[0], 1.0) and np.allclose(pixels[1:], -1.0)  # red, in [-1, 1]
    assert rows[0].caption == "red" and rows[0].row == 1


def test_the_shorter_side_is_resized_and_the_centre_cropped():
    pixels = to_pixels(two_halves(64, 32), 16)  # 32 x 16 after resizing, then 16 x 16
    assert pixels.shape == (3, 16, 16)
    assert np.allclose(pixels[0, :, :6], 1.0) and np.allclose(pixels[2, :, -6:], 1.0)


def test_parquet_rows_hold_the_bytes_or_datasets_image_structs(tmp_path):
    path = str(tmp_path / "images.parquet")
    table = pa.table(
        {
            "image": [{"bytes": png(8, 8), "path": None}, {"bytes": png(9, 9), "path": None}],
            "caption": ["one", "two"],
        }
    )
    pq.write_table(table, path)
    rows = image_rows(read_rows(path, "parquet"), path)
    assert [decode(r.image, where="x").size for r in rows] == [(8, 8), (9, 9)]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"image": "/etc/passwd", "caption": "x"}, "must be a path relative to the data file"),
        ({"image": "img/../../secret.png", "caption": "x"}, "without '..'"),
        ({"image": "img/a.png"}, "row 1: no field 'caption'"),
        ({"image": 3, "caption": "x"}, "field 'image' must be a string or bytes or dict"),
    ],
)
def test_bad_rows_are_refused_naming_the_row(folder, record, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        rows_of(folder, [record])


def test_bad_images_are_refused_naming_file_and_row(folder, monkeypatch, tmp_path_factory):
    roots = Roots.of([str(folder)], [])
    path, rows = rows_of(
        folder,
        [
            {"image": "img/notes.txt", "caption": "x"},
            {"image": "img/missing.png", "caption": "x"},
            {"image": "img/b.png", "caption": "x"},
            {"image": "img/link.png", "caption": "x"},
        ],
    )
    with pytest.raises(ValueError, match=r"row 1: not an image Pillow can read"):
        decode(image_bytes(rows[0], roots), where=rows[0].where)
    with pytest.raises(ValueError, match=r"row 2: image 'img/missing.png' does not exist"):
        image_bytes(rows[1], roots)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 1000)  # b.png is 64 x 32 = 2048
    with pytest.raises(ValueError, match=r"row 3: the image is 64 x 32 pixels, over 1000"):
        decode(image_bytes(rows[2], roots), where=f"{path!r} row 3")
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10)
    with pytest.raises(ConfinementError, match=r"row 3: \d+ bytes, over the 10-byte limit"):
        image_bytes(rows[2], roots)
    outside = tmp_path_factory.mktemp("outside") / "x.png"
    outside.write_bytes(png(4, 4))
    os.symlink(outside, folder / "img" / "link.png")
    with pytest.raises(ConfinementError):
        image_bytes(rows[3], roots)
