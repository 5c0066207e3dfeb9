"""Pretrained Hugging Face models (model.hf): etrain's decoder reproduces transformers' exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.support.hf_fixtures import hf_config, make_hf_model
from workers.models.config import count_params
from workers.models.hf_config import SUPPORTED_ARCHITECTURES, config_from_hf
from workers.models.hf_load import (
    LocalWeights,
    _plain_name,
    _read_block,
    hf_model_config,
    load_pretrained,
    materialize,
    weight_files,
)
from workers.models.hf_naming import from_hf_tensor, to_hf_name
from workers.models.llama import build_model
from workers.stepper import loss_fn

CASES = [
    ("llama", {}),
    ("llama", {"tied": True}),
    ("mistral", {}),
    # Llama 3.1's RoPE scaling, with a short original context so that it bites here.
    (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    ("qwen2", {}),
    ("qwen2", {"tied": True}),
]


def _etrain_from(folder):
    cfg = hf_model_config(str(folder))
    model = build_model(cfg, seed=0, device="meta")
    materialize(model, device="cpu")
    assert load_pretrained([model], str(folder), cfg) == len(list(model.parameters()))
    return model.eval(), cfg


@pytest.mark.parametrize(
    ("arch", "extra"), CASES, ids=[f"{a}-{'-'.join(sorted(e))}" for a, e in CASES]
)
def test_logits_and_first_loss_equal_transformers(tmp_path, arch, extra):
    # Sharded and in bf16 on disk for one case each: the index and the cast are read too.
    shard = {"max_shard_size": "40KB"} if arch == "qwen2" and not extra else {}
    ref = make_hf_model(tmp_path, arch, seed=3, **extra, **shard)
    model, cfg = _etrain_from(tmp_path)
    assert cfg.qkv_bias is (arch == "qwen2")
    assert (cfg.rope_scaling is not None) is ("rope_parameters" in extra)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(tokens).logits
        got = model(tokens)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        ref_loss = ref(tokens, labels=tokens).loss  # transformers shifts the labels itself
        loss = loss_fn(model(inputs), targets)
    assert abs(loss.item() - ref_loss.item()) < 1e-5


def test_bf16_weights_load_cast(tmp_path):
    ref = make_hf_model(tmp_path, "llama", dtype=torch.bfloat16)
    model, _ = _etrain_from(tmp_path)
    weight = ref.model.layers[1].mlp.down_proj.weight.to(torch.bfloat16).float()
    assert torch.equal(model.layers["1"].feed_forward.w2.weight, weight)


def test_unsupported_architecture_names_model_hf_and_the_supported_list():
    config = hf_config("llama").to_dict() | {"architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(ValueError, match=r"model\.hf") as info:
        config_from_hf(config)
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ({"head_dim": 32}, "head_dim"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_attention_heads": 5, "head_dim": None}, "divisible"),
    ],
)
def test_config_it_cannot_reproduce_is_refused(change, message):
    config = json.loads(json.dumps(hf_config("llama").to_dict())) | change
    with pytest.raises(ValueError, match=message):
        config_from_hf(config)


def test_mistral_sliding_window_clamps_max_seq_len():
    config = hf_config("mistral", max_position_embeddings=4096, sliding_window=512).to_dict()
    assert config_from_hf(config).max_seq_len == 512


def test_missing_weights_name_model_hf(tmp_path):
    (tmp_path / "config.json").write_text(hf_config("llama").to_json_string())
    with pytest.raises(ValueError, match=r"model\.hf.*safetensors"):
        load_pretrained([], str(tmp_path), hf_model_config(str(tmp_path)))


@pytest.mark.parametrize(("start", "rows"), [(0, 64), (8, 16), (20, 7), (60, 4)])
def test_a_block_of_rows_cutting_heads_reads_like_the_whole_tensor_cut(tmp_path, start, rows):
    # FSDP shards dim 0 evenly, so a rank's rows of wq/wk may begin or end inside a head.
    make_hf_model(tmp_path, "qwen2")
    cfg = hf_model_config(str(tmp_path))
    files = weight_files(str(tmp_path))
    for fqn in ("layers.1.attention.wq.weight", "layers.1.attention.wq.bias"):
        name = to_hf_name(fqn)
        with safe_open(files[name], framework="pt") as f:
            whole = from_hf_tensor(fqn, f.get_tensor(name), cfg)
        shape = (rows, *whole.shape[1:])
        offset = (start,) + (0,) * (whole.dim() - 1)
        block = _read_block(LocalWeights(str(tmp_path)), name, fqn, shape, offset, cfg)
        assert torch.equal(block, whole[start : start + rows])


def test_transformers_4_config_layout_maps_too():
    # Llama 3.1 as saved by transformers 4.x: rope_theta at the top, rope_scaling beside it.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    cfg = config_from_hf(config)
    assert (cfg.rope_theta, cfg.rope_scaling.factor, cfg.max_seq_len) == (500000.0, 8.0, 131072)
    assert count_params(cfg) == 8_030_261_248  # Llama 3.1 8B's published count


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        ("module.layers.0.attention.wq.base_layer.weight", "layers.0.attention.wq.weight"),
        (
            "_orig_mod.layers.1._checkpoint_wrapped_module.attention.wk.bias",
            "layers.1.attention.wk.bias",
        ),
        ("base_model.model.output.weight", "output.weight"),
    ],
)
def test_wrapper_prefixes_map_to_the_models_own_names(name, plain):
    assert _plain_name(name) == plain


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("num_hidden_layers", 1_000_000, "from 1 to 1,024"),
        ("num_hidden_layers", 0, "from 1 to 1,024"),
        ("hidden_size", 2**40, "from 1 to 65,536"),
        ("num_attention_heads", 4096, "from 1 to 1,024"),
        ("num_key_value_heads", 10**6, "from 1 to 1,024"),
        ("intermediate_size", 10**9, "from 1 to 262,144"),
        ("vocab_size", 10**12, "from 1 to 4,194,304"),
        ("max_position_embeddings", 2**40, "from 1 to 16,777,216"),
        ("sliding_window", 2**40, "from 1 to 16,777,216"),
        ("num_hidden_layers", "9" * 5000, "from 1 to 1,024, got '99999"),
    ],
)
def test_every_number_of_config_json_has_a_range(key, value, accepted):
    """A config.json with num_hidden_layers 1,000,000 cost 5.9 s per POST /v1/plan."""
    config = hf_config("mistral").to_dict() | {key: value}
    with pytest.raises(ValueError) as e:
        config_from_hf(config)
    text = str(e.value)
    assert text.startswith(f"model.hf: config.json {key} must be") and accepted in text
    assert len(text) < 200  # a huge value is cut short, not echoed


def test_rope_numbers_have_ranges_too():
    llama31 = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    llama31 |= {"factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 5e5}
    config = hf_config("llama").to_dict()
    assert config_from_hf(config | {"rope_parameters": llama31}).rope_scaling.factor == 8.0
    for key, value, accepted in [
        ("factor", 1e9, "a number from 1 to 1024"),
        ("original_max_position_embeddings", 2**40, "an integer from 1 to 16,777,216"),
        ("rope_theta", 1e300, "a number above 0 up to 1e+12"),
        ("rope_theta", "10000", "a number above 0 up to 1e+12"),
    ]:
        with pytest.raises(ValueError) as e:
            config_from_hf(config | {"rope_parameters": llama31 | {key: value}})
        assert f"config.json {key} must be {accepted}" in str(e.value)


def test_the_largest_published_shapes_are_in_range():
    # Llama 3.1 405B's config.json, the largest dense Llama.
    config = hf_config("llama").to_dict() | {
        "num_hidden_layers": 126,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "head_dim": 128,
    }
    cfg = config_from_hf(config)
    assert (cfg.n_layers, cfg.dim, cfg.vocab_size) == (126, 16384, 128256)
    assert count_params(cfg) > 400e9


def test_the_ranges_are_documented_where_model_hf_is():
    from workers.models.hf_config import RANGES
    from workers.spec.model import ModelSpec

    text = ModelSpec.model_fields["hf"].description
    for key, (_, high) in RANGES.items():
        shown = f"{high:,}" if isinstance(high, int) else f"{high:g}"
        assert key in text and shown in text, (key, shown)
