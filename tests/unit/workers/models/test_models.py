"""Unit tests for the Llama-style model in ``workers.models``."""

import pytest
import torch

from workers.models.config import PRESETS, ModelConfig, count_params, get_model_config
from workers.models.llama import Transformer, build_model

TINY = get_model_config("gpt-tiny")


def test_presets_exist():
    assert set(PRESETS) == {"gpt-tiny", "gpt-small", "llama-1b", "llama-7b", "llama-70b"}


def test_unknown_preset_lists_known():
    with pytest.raises(ValueError, match="gpt-tiny"):
        get_model_config("gpt-huge")


@pytest.mark.parametrize(
    "overrides, field",
    [({"dim": 66}, "n_heads"), ({"n_kv_heads": 3}, "n_kv_heads"), ({"n_layers": 0}, "n_layers")],
)
def test_config_validation(overrides, field):
    base = dict(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=32
    )
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**base, **overrides})


@pytest.mark.parametrize("preset", ["gpt-tiny", "gpt-small"])
def test_build_forward_shape_and_param_count(preset):
    cfg = get_model_config(preset)
    model = build_model(cfg, seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, cfg.vocab_size)
    assert logits.dtype == torch.float32
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", ["llama-1b", "llama-7b", "llama-70b"])
def test_big_presets_build_on_meta(preset):
    cfg = get_model_config(preset)
    model = build_model(cfg, seed=0, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def test_known_param_counts():
    # Untied embeddings: Llama 2 7B is 6.74B parameters.
    assert count_params(get_model_config("llama-7b")) == 6_738_415_616


def test_module_names_follow_torchtitan():
    model = build_model(TINY, seed=0)
    names = set(dict(model.named_parameters()))
    for suffix in (
        "attention.wq.weight",
        "attention.wk.weight",
        "attention.wv.weight",
        "attention.wo.weight",
        "feed_forward.w1.weight",
        "feed_forward.w2.weight",
        "feed_forward.w3.weight",
        "attention_norm.weight",
        "ffn_norm.weight",
    ):
        assert f"layers.1.{suffix}" in names
    assert {"tok_embeddings.weight", "norm.weight", "output.weight"} <= names
    assert "freqs_cis" not in model.state_dict()


def test_causal():
    model = build_model(TINY, seed=1)
    tokens = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_seed_determinism():
    a, b, c = build_model(TINY, seed=7), build_model(TINY, seed=7), build_model(TINY, seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.output.weight, c.output.weight)


def test_init_scales():
    model = build_model(get_model_config("gpt-small"), seed=0)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    wq_std = model.layers["0"].attention.wq.weight.std().item()
    wo_std = model.layers["0"].attention.wo.weight.std().item()
    assert wq_std == pytest.approx(0.02, rel=0.05)
    assert wo_std == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.05)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_gqa_matches_repeated_kv_heads(n_kv_heads):
    cfg = ModelConfig(
        vocab_size=64,
        dim=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        ffn_hidden=64,
        max_seq_len=16,
    )
    gqa = build_model(cfg, seed=3)
    mha_cfg = ModelConfig(**{**cfg.__dict__, "n_kv_heads": 4})
    mha = Transformer(mha_cfg)
    state = gqa.state_dict()
    rep = 4 // n_kv_heads
    for key in ("layers.0.attention.wk.weight", "layers.0.attention.wv.weight"):
        # Expanding each kv head's rows reproduces the grouped-query model as plain MHA.
        state[key] = (
            state[key]
            .view(n_kv_heads, cfg.head_dim, cfg.dim)
            .repeat_interleave(rep, 0)
            .reshape(-1, cfg.dim)
        )
    mha.load_state_dict(state)
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens), mha(tokens))


def test_pipeline_stage_modules_may_be_removed():
    model = build_model(TINY, seed=0)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8))
    with torch.no_grad():
        full = model(tokens)
        first = build_model(TINY, seed=0)
        first.norm, first.output = None, None
        del first.layers["1"]
        last = build_model(TINY, seed=0)
        last.tok_embeddings = None
        del last.layers["0"]
        hidden = first(tokens)
        assert hidden.shape == (2, 8, TINY.dim)
        torch.testing.assert_close(last(hidden), full)


def test_sequence_longer_than_max_rejected():
    cfg = ModelConfig(
        vocab_size=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=32, max_seq_len=4
    )
    with pytest.raises(ValueError, match="max_seq_len"):
        build_model(cfg, seed=0)(torch.zeros(1, 5, dtype=torch.long))


def test_meta_then_materialise_matches_eager():
    meta = build_model(TINY, seed=5, device="meta")
    meta.to_empty(device="cpu")
    meta.init_weights(generator=torch.Generator().manual_seed(5))
    eager = build_model(TINY, seed=5)
    tokens = torch.randint(0, TINY.vocab_size, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(meta(tokens), eager(tokens))


def test_bf16_cast_keeps_rotary_working():
    model = build_model(TINY, seed=0)
    tokens = torch.randint(0, TINY.vocab_size, (1, 8))
    with torch.no_grad():
        ref = model(tokens)
        low = model.to(torch.bfloat16)(tokens).float()
    torch.testing.assert_close(low, ref, atol=0.05, rtol=0.05)


def test_rotary_matches_complex_reference():
    from workers.models.llama import apply_rotary_emb, precompute_freqs_cis

    x = torch.randn(2, 5, 3, 8)
    freqs = precompute_freqs_cis(head_dim=8, max_seq_len=5, theta=10000.0)
    cis = torch.polar(torch.ones_like(freqs[..., 0]), torch.atan2(freqs[..., 1], freqs[..., 0]))
    ref = torch.view_as_real(
        torch.view_as_complex(x.reshape(2, 5, 3, 4, 2)) * cis[None, :, None]
    ).flatten(-2)
    torch.testing.assert_close(apply_rotary_emb(x, freqs), ref)
