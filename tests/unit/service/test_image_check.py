"""Submit-time checks of objective diffusion: a diffusers folder missing a part (or with
pickled weights, or another family's classes) and images with captions whose row is bad
(no field, not an image, a path out of the folder, a caption over the text encoder's
length) are refused naming the file or row; a good head passes."""

from __future__ import annotations

import io
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from service.domain.data_check import data_refusals
from service.domain.model_source import ModelRefused, model_config_of
from tests.support.hf_fixtures import make_tokenizer
from workers.spec import JobSpec

INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "scheduler": ["diffusers", "DDPMScheduler"],
}


def safetensors(tensors: dict[str, list[int]]) -> bytes:
    """A safetensors file of fp32 zeros of these shapes (what the header says is read)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(offset)


UNET = {  # one attention: self (to_k 16 -> 16) and cross (to_k 8 -> 16)
    "conv_in.weight": [16, 4, 3, 3],
    "blocks.0.attn1.to_q.weight": [16, 16],
    "blocks.0.attn1.to_k.weight": [16, 16],
    "blocks.0.attn1.to_v.weight": [16, 16],
    "blocks.0.attn1.to_out.0.weight": [16, 16],
    "blocks.0.attn1.to_out.0.bias": [16],
    "blocks.0.attn2.to_q.weight": [16, 16],
    "blocks.0.attn2.to_k.weight": [16, 8],
    "blocks.0.attn2.to_v.weight": [16, 8],
    "blocks.0.attn2.to_out.0.weight": [16, 16],
}


def png(colour=(255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (12, 10), colour).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    make_tokenizer(path)
    return path


@pytest.fixture
def folder(tmp_path, tokenizer_dir):
    """The layout of a diffusers folder (configs, weight files' names, tokenizer)."""
    root = tmp_path / "sd"
    (root / "tokenizer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps(INDEX))
    for part, weights, tensors in [
        ("unet", "diffusion_pytorch_model.safetensors", UNET),
        ("vae", "diffusion_pytorch_model.safetensors", {"w": [3, 5]}),
        ("text_encoder", "model.safetensors", {"w": [7], "v": [2, 2]}),
    ]:
        (root / part).mkdir()
        config = {"max_position_embeddings": 8, "block_out_channels": [16, 32]}
        (root / part / "config.json").write_text(json.dumps(config))
        (root / part / weights).write_bytes(safetensors(tensors))
    (root / "scheduler").mkdir()
    (root / "scheduler" / "scheduler_config.json").write_text("{}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (root / "tokenizer" / name).write_bytes((tokenizer_dir / name).read_bytes())
    return root


def spec_of(folder, data: dict) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "sd",
            "objective": "diffusion",
            "model": {"hf": str(folder), "lora": {}},
            "data": {"shape": "image", **data},
        }
    )


def jsonl(tmp_path, rows: list[dict], images: dict[str, bytes]) -> dict:
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"source": "jsonl", "path": str(path)}


def refusals(spec) -> list[str]:
    return [msg for _, msg in data_refusals(spec)]


def test_a_good_folder_and_head_pass_and_the_plan_counts_each_part(folder, tmp_path):
    from service.domain.planned_memory import planned_memory
    from service.planner import plan_job

    data = jsonl(tmp_path, [{"image": "a.png", "caption": "a red fox"}], {"a.png": png()})
    spec = spec_of(folder, data)
    shape = model_config_of(spec)  # read from the weights' headers, not the weights
    unet = sum(math.prod(s) for s in UNET.values())
    assert (shape.unet_params, shape.vae_params, shape.text_encoder_params) == (unet, 15, 11)
    assert refusals(spec) == []
    plan = plan_job(spec, model_config=shape)
    rank = spec.model.lora.rank  # q, k, v, out of both attentions: r * (in + out) each
    adapters = rank * (6 * 32 + 2 * (8 + 16))
    assert plan.breakdown.lora_trainable_params == adapters
    assert plan.num_params == unet + 26 and plan.verdict == "fits"  # a CPU job
    assert plan.breakdown.buffers == {"vae": 60, "text_encoder": 44}
    assert plan.per_rank.params_bytes == 4 * (unet + adapters)
    assert plan.per_rank.optimizer_bytes == 8 * adapters  # AdamW, the default
    # The job page's plan: the same figures per kind, and each frozen part by name.
    planned = planned_memory(spec, 1)
    assert planned == {
        **plan.per_rank.model_dump(exclude={"buffers_bytes"}),
        "vae_bytes": 60,
        "text_encoder_bytes": 44,
    }
    unseen = plan_job(spec_of(tmp_path / "elsewhere", data), model_config=None)
    assert unseen.verdict == "unknown" and "cannot read model.hf" in unseen.unknown_reason


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda f: (f / "vae" / "config.json").unlink(), "vae/config.json is missing"),
        (
            lambda f: (f / "unet" / "diffusion_pytorch_model.safetensors").rename(
                f / "unet" / "diffusion_pytorch_model.bin"
            ),
            "never pickled .bin files",
        ),
        (
            lambda f: (f / "model_index.json").write_text(
                json.dumps({**INDEX, "unet": ["diffusers", "SD3Transformer2DModel"]})
            ),
            "names unet 'SD3Transformer2DModel'",
        ),
        (lambda f: (f / "tokenizer" / "tokenizer.json").unlink(), "holds neither tokenizer.json"),
        (lambda f: (f / "model_index.json").write_text("[1]"), "is not a JSON object"),
    ],
)
def test_a_folder_missing_a_part_is_refused_naming_it(folder, tmp_path, change, said):
    change(folder)
    data = jsonl(tmp_path, [{"image": "a.png", "caption": "a fox"}], {"a.png": png()})
    with pytest.raises(ModelRefused, match=r"model\.hf") as e:
        model_config_of(spec_of(folder, data))
    assert said in str(e.value)


@pytest.mark.parametrize(
    ("rows", "images", "said"),
    [
        ([{"image": "a.png"}], {"a.png": png()}, "row 1: no field 'caption'"),
        (
            [{"image": "a.png", "caption": "ok"}, {"image": "b.png", "caption": "ok"}],
            {"a.png": png(), "b.png": b"this is text"},
            "row 2: not an image Pillow can read",
        ),
        ([{"image": "../x.png", "caption": "ok"}], {}, "without '..'"),
        ([{"image": "gone.png", "caption": "ok"}], {}, "does not exist beside the data file"),
        (
            [{"image": "a.png", "caption": "the quick brown fox jumps over the lazy dog " * 3}],
            {"a.png": png()},
            "row 1: the caption is",
        ),
    ],
)
def test_a_bad_row_is_refused_naming_file_and_row(folder, tmp_path, rows, images, said):
    found = refusals(spec_of(folder, jsonl(tmp_path, rows, images)))
    assert len(found) == 1 and said in found[0], found
    assert "rows.jsonl" in found[0]


def write_clip_vocab(path) -> None:
    """CLIP's slow tokenizer files as Stable Diffusion 1.5 ships them (vocab.json,
    merges.txt, tokenizer_config.json; no tokenizer.json): the byte-level alphabet, each
    letter also as a word's end, no merges."""
    from tokenizers.pre_tokenizers import ByteLevel

    letters = sorted(ByteLevel.alphabet())
    names = [*letters, *(c + "</w>" for c in letters), "<|startoftext|>", "<|endoftext|>"]
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(names)}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    config = {"tokenizer_class": "CLIPTokenizer", "bos_token": "<|startoftext|>"}
    config |= dict.fromkeys(("eos_token", "unk_token", "pad_token"), "<|endoftext|>")
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def test_a_caption_is_counted_by_clips_own_files_without_tokenizer_json(folder, tmp_path):
    """The text encoder takes 8 positions; CLIP's files split "a red fox" into 7 letters
    (no merges) plus start and end: 9 tokens, refused at submit; "a fox" (7) passes."""
    tok = folder / "tokenizer"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tok / name).unlink()
    write_clip_vocab(tok)
    rows = [{"image": "a.png", "caption": "a fox"}, {"image": "a.png", "caption": "a red fox"}]
    found = refusals(spec_of(folder, jsonl(tmp_path, rows, {"a.png": png()})))
    assert len(found) == 1 and "row 2: the caption is 9 tokens" in found[0], found
    assert refusals(spec_of(folder, jsonl(tmp_path, rows[:1], {"a.png": png()}))) == []


@pytest.mark.parametrize("config", ["[1, 2]", '{"tokenizer_class": 5}'])
def test_a_malformed_tokenizer_config_is_a_value_error_not_a_crash(folder, tmp_path, config):
    """transformers raises AttributeError on these; the submit check must not 500 and the
    workers' error names the folder."""
    from workers.models.diffusers_folder import load_tokenizer
    from workers.storage.confine import UNCONFINED

    (folder / "tokenizer" / "tokenizer_config.json").write_text(config)
    with pytest.raises(ValueError, match=r"tokenizer/ cannot be loaded as a tokenizer"):
        load_tokenizer(str(folder), UNCONFINED)
    rows = [{"image": "a.png", "caption": "a fox"}]
    assert refusals(spec_of(folder, jsonl(tmp_path, rows, {"a.png": png()}))) == []


def test_parquet_image_bytes_that_are_no_image_are_refused(folder, tmp_path):
    path = tmp_path / "rows.parquet"
    table = pa.table({"image": [png(), b"\x89PNG broken"], "caption": ["a", "b"]})
    pq.write_table(table, path)
    found = refusals(spec_of(folder, {"source": "parquet", "path": str(path)}))
    assert len(found) == 1 and "row 2: not an image" in found[0], found


def test_the_spec_refuses_what_diffusion_cannot_train(folder):
    base = {"name": "sd", "objective": "diffusion", "data": {"shape": "image"}}
    cases = {
        "set model.hf": {"model": {}},
        "add model.lora": {"model": {"hf": str(folder)}},
        "remove model.tokenizer": {"model": {"hf": str(folder), "lora": {}, "tokenizer": "/t"}},
        "copy it from the object store": {"model": {"hf": "s3://b/sd", "lora": {}}},
        "parallelism.strategy tp is not available": {
            "model": {"hf": str(folder), "lora": {}},
            "parallelism": {"strategy": "tp", "tp": 2},
            "resources": {"workers": 2},
        },
        "data.shape image is not trained by objective causal_lm": {"objective": "causal_lm"},
    }
    for said, change in cases.items():
        raw = {**base, **change}
        raw["data"] = {"source": "jsonl", "path": "/d/r.jsonl", "shape": "image"}
        with pytest.raises(ValueError, match=said.replace(".", r"\.")):
            JobSpec.model_validate(raw)


def test_the_check_decodes_a_bounded_number_of_pixels(folder, tmp_path, monkeypatch):
    """A small file may hold a huge picture of one colour: past the budget of decoded
    pixels the check stops (the workers decode the rest) instead of decoding them all."""
    from service.domain import image_check
    from workers.data import images

    decoded = []
    monkeypatch.setattr(image_check, "MAX_CHECKED_PIXELS", 3 * 12 * 10)
    monkeypatch.setattr(
        image_check,
        "decode",
        lambda data, where: decoded.append(where) or images.decode(data, where=where),
    )
    rows = [{"image": "a.png", "caption": "ok"}] * 5 + [{"image": "bad.png", "caption": "ok"}]
    data = jsonl(tmp_path, rows, {"a.png": png(), "bad.png": b"not an image"})
    assert refusals(spec_of(folder, data)) == []
    assert len(decoded) == 3
