"""Tokenizers and small data files the data tests share (built once per session)."""

from __future__ import annotations

import json

import pytest

from tests.support.hf_fixtures import make_tokenizer, make_word_tokenizer

CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "four."},
        {"role": "user", "content": "And the fox?"},
        {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
    ],
    [
        {"role": "user", "content": "Hello world!"},
        {"role": "assistant", "content": "Hello!"},
    ],
]
INSTRUCTIONS = [
    {"prompt": "Question: what is two plus two?", "completion": " Answer: four."},
    {"prompt": "Hello world!", "completion": " The quick brown fox jumps over the lazy dog."},
    {"prompt": "Fine-tuning a pretrained model needs", "completion": " patience."},
    {"prompt": "Elastic training resumes", "completion": " exactly where it stopped."},
]


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    """(folder, tokenizer): a byte-level BPE with a chat template."""
    folder = tmp_path_factory.mktemp("bpe")
    return str(folder), make_tokenizer(folder)


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory):
    """(folder, tokenizer): word-level, fits the presets' 256-token vocabulary."""
    folder = tmp_path_factory.mktemp("words")
    return str(folder), make_word_tokenizer(folder)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
