"""Pretrained Hugging Face models (model.hf): etrain's decoder reproduces transformers' exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.support.hf_fixtures import ARCHITECTURES, hf_config, make_hf_model
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
from workers.models.hf_naming import (
    from_hf_state_dict,
    from_hf_tensor,
    to_hf_name,
    to_hf_state_dict,
)
from workers.models.llama import build_model
from workers.stepper import loss_fn

YARN = {"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0}
YARN |= {"original_max_position_embeddings": 32}
YARN_MSCALE = YARN | {"beta_fast": 8, "beta_slow": 2, "mscale": 1.2, "mscale_all_dim": 0.8}
YARN_MSCALE |= {"truncate": False}
GEMMA3_LINEAR = {
    "full_attention": {"rope_type": "linear", "rope_theta": 5e4, "factor": 8.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
}
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 5e4,
    "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0],
    "long_factor": [1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
    "original_max_position_embeddings": 16,
}
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
    ("llama", {"head_dim": 32}),  # wider heads than hidden / heads
    ("qwen3", {}),
    ("qwen3", {"tied": True}),
    ("qwen3", {"rope_parameters": YARN}),
    ("gemma2", {}),
    ("gemma3", {}),
    ("gemma3", {"rope_parameters": GEMMA3_LINEAR}),
    ("phi3", {}),
    # Phi-3's longrope: 24 tokens are past the original 16, so the long factors rotate.
    ("phi3", {"original_max_position_embeddings": 16, "rope_parameters": LONGROPE}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e4, "factor": 4.0}}),
    # Dynamic NTK raises the base past max_position_embeddings (16 < 24 tokens).
    (
        "llama",
        {
            "max_position_embeddings": 16,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 5e4, "factor": 2.0},
        },
    ),
    ("mistral", {"rope_parameters": YARN_MSCALE}),
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
    shard = {"max_shard_size": "40KB"} if arch in ("qwen2", "phi3") and not extra else {}
    ref = make_hf_model(tmp_path, arch, seed=3, **extra, **shard)
    model, cfg = _etrain_from(tmp_path)
    assert cfg.qkv_bias is (arch == "qwen2")
    assert (cfg.rope_scaling is not None) is ("rope_parameters" in extra)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    assert count_params(cfg) == sum(p.numel() for p in ref.parameters()) + (
        cfg.vocab_size * cfg.dim if ref.config.tie_word_embeddings else 0
    )
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(tokens).logits
        got = model(tokens)
    print(f"{arch} {sorted(extra)}: max |logit difference| {(got - expected).abs().max():.2e}")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        ref_loss = ref(tokens, labels=tokens).loss  # transformers shifts the labels itself
        loss = loss_fn(model(inputs), targets)
    assert abs(loss.item() - ref_loss.item()) < 1e-5


FEATURES = [
    ("gemma2", {}, {"attn_softcap": None}),
    ("gemma2", {}, {"final_softcap": None}),
    ("gemma2", {}, {"attn_scale": None}),
    ("gemma2", {}, {"layer_types": (), "sliding_window": None}),
    ("gemma2", {}, {"embed_scale": False}),
    ("gemma2", {}, {"activation": "silu"}),
    ("gemma3", {}, {"local_rope_theta": 5e4}),
    ("gemma3", {"rope_parameters": GEMMA3_LINEAR}, {"rope_scaling": None}),
    ("phi3", {}, {"layer_types": (), "sliding_window": None}),
    ("qwen3", {"rope_parameters": YARN}, {"rope_scaling": None}),
    ("mistral", {"rope_parameters": YARN_MSCALE}, {"rope_scaling": None}),
    (
        "phi3",
        {"original_max_position_embeddings": 16, "rope_parameters": LONGROPE},
        {"rope_scaling": None},
    ),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0}}, {"rope_scaling": None}),
    (
        "llama",
        {"max_position_embeddings": 16, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
        {"rope_scaling": None, "max_seq_len": 32},
    ),
]


@pytest.mark.parametrize(
    ("arch", "extra", "without"), FEATURES, ids=[f"{a}-{'-'.join(w)}" for a, _, w in FEATURES]
)
def test_each_family_feature_changes_the_logits(tmp_path, arch, extra, without):
    """The tiny models are built so that every feature matters: leaving one out of the
    config (same weights) moves the logits far beyond the exactness tolerance."""
    import dataclasses

    make_hf_model(tmp_path, arch, seed=3, **extra)
    model, cfg = _etrain_from(tmp_path)
    other = dataclasses.replace(cfg, **without)
    plain = build_model(other, seed=0, device="meta")
    materialize(plain, device="cpu")
    load_pretrained([plain], str(tmp_path), other)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(tokens) - plain.eval()(tokens)).abs().max() > 1e-3


def test_longrope_uses_the_short_factors_within_the_original_context(tmp_path):
    extra = {"original_max_position_embeddings": 16, "rope_parameters": LONGROPE}
    ref = make_hf_model(tmp_path, "phi3", seed=3, **extra)
    model, cfg = _etrain_from(tmp_path)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for length in (16, 24, 12):  # short, long, short again: no state is kept
            want = ref(tokens[:, :length]).logits
            torch.testing.assert_close(model(tokens[:, :length]), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_state_dict_names_and_layout_round_trip_with_the_checkpoint(tmp_path, arch):
    """etrain's state dict in the family's names (Gemma's norms, Phi-3's fused tensors)
    is the checkpoint transformers wrote, tensor for tensor, and back."""
    from safetensors.torch import load_file

    make_hf_model(tmp_path, arch, seed=3)
    model, cfg = _etrain_from(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    ours = to_hf_state_dict(model.state_dict(), cfg)
    assert ours.keys() == saved.keys()
    assert all(torch.equal(ours[k], saved[k]) for k in saved)
    back = from_hf_state_dict(saved, cfg)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


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
    ("arch", "change", "message"),
    [
        ("llama", {"rope_parameters": {"rope_type": "proportional"}}, "'proportional'"),
        ("llama", {"rope_parameters": {"partial_rotary_factor": 0.5}}, "partial rotary"),
        ("llama", {"head_dim": 7}, "even for RoPE"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("llama", {"num_attention_heads": 5, "head_dim": None}, "divisible"),
        ("qwen3", {"attention_bias": True}, "attention_bias"),
        ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma2", {"layer_types": ["local", "global"]}, "layer_types"),
        (
            "phi3",
            {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0]}},
            "short_factor",
        ),
    ],
)
def test_config_it_cannot_reproduce_is_refused(arch, change, message):
    config = json.loads(json.dumps(hf_config(arch).to_dict())) | change
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
