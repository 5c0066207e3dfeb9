"""Tiny Hugging Face model folders and tokenizers built in the test (no hub access).

``make_hf_model`` writes a random-weight model of one of :data:`ARCHITECTURES` (Llama,
Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 text, Phi-3) with ``save_pretrained`` (optionally
sharded with an index);
``make_tokenizer`` trains a byte-level BPE with ``tokenizers`` and saves it through
``PreTrainedTokenizerFast`` (tokenizer.json, tokenizer_config.json, chat template);
``make_hf_folder`` puts both in one folder, as people download them.
"""

from __future__ import annotations

from pathlib import Path

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
# What each family needs to be tiny and to show what it changes: a head width other than
# hidden / heads, a sliding window shorter than the tests' sequences on alternating layers,
# soft-capping thresholds low enough to bite, a score scale other than the head width's.
FAMILY_DEFAULTS = {
    "qwen3": {"head_dim": 32},
    "gemma2": {
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "sliding_window": 6,
        "attn_logit_softcapping": 1.5,
        "final_logit_softcapping": 2.0,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3": {
        "head_dim": 32,
        "query_pre_attn_scalar": 24,
        "sliding_window": 6,
        "sliding_window_pattern": 2,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 50000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        },
    },
    "phi3": {"sliding_window": 10},
}
# A template in the usual shape: role markers, EOS after each turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Fine-tuning a pretrained model needs a tokenizer, a dataset and patience.",
    "Question: what is two plus two? Answer: four.",
    "Elastic training resumes exactly where it stopped, on any number of workers.",
    "Hello world! Numbers 0123456789 and punctuation: ,.;:?!-()[]{}",
]


def hf_config(
    arch: str = "llama",
    *,
    vocab_size: int = 384,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 128,
    tied: bool = False,
    **extra,
):
    """A transformers config object of a tiny model of family ``arch`` (a key of
    :data:`ARCHITECTURES`; :data:`FAMILY_DEFAULTS` adds what the family needs)."""
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma2": transformers.Gemma2Config,
        "gemma3": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
    }[arch]
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        architectures=[ARCHITECTURES[arch]],
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    if arch == "mistral":
        kwargs["sliding_window"] = max_position_embeddings
    kwargs.update(FAMILY_DEFAULTS.get(arch, {}))
    kwargs.update(extra)
    return cls(**kwargs)


def make_hf_model(
    path: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    max_shard_size: str | int | None = None,
    dtype=None,
    **config_kwargs,
):
    """Save a random tiny causal LM under ``path``; returns the fp32 transformers model.

    ``max_shard_size`` (e.g. ``"20KB"``) writes ``model.safetensors.index.json`` plus
    shards; ``dtype`` (e.g. ``torch.bfloat16``) stores the weights in that type. Biases
    (Qwen2 q/k/v) get random values too, so a test notices one that is dropped.
    """
    import torch
    import transformers

    config = hf_config(arch, **config_kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)
    model.eval()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    saved = model if dtype is None else _copy_to(model, dtype)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    saved.save_pretrained(path, **kwargs)
    return model


def _copy_to(model, dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


def make_tokenizer(path: str | Path, *, vocab_size: int = 384, corpus: list[str] | None = None):
    """Train a byte-level BPE on ``corpus`` and save it as a transformers fast tokenizer.

    Writes tokenizer.json, tokenizer_config.json (bos ``<s>`` = 0, eos ``</s>`` = 1,
    pad ``<pad>`` = 2) and the chat template; returns the ``PreTrainedTokenizerFast``.
    The vocabulary never exceeds ``vocab_size`` (the tiny models' default).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 8,  # headroom: the fast tokenizer may add a token or two
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def make_hf_folder(path: str | Path, arch: str = "llama", **kwargs):
    """A model folder as downloaded: tiny model (see :func:`make_hf_model`) plus tokenizer."""
    model = make_hf_model(path, arch, **kwargs)
    make_tokenizer(path, vocab_size=model.config.vocab_size)
    return model


def make_word_tokenizer(path: str | Path, *, corpus: list[str] | None = None):
    """A word-level tokenizer (whitespace split) small enough for the built-in presets'
    256-token vocabulary; same special tokens, ids and chat template as :func:`make_tokenizer`.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for line in corpus or CORPUS for w in line.split()})
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, "<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast
