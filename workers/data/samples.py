"""Turning rows into fixed-length token samples, shape by shape.

Every sample is ``seq_len + 1`` tokens with a 0/1 ``target`` flag per token:
position ``t`` is trained to predict token ``t + 1`` only when that token's flag
is 1. ``text`` packs documents into one stream with EOS between them and cuts it
into non-overlapping windows (every token a target); ``instruction`` and ``chat``
give one sample per row, padded, whose targets are the completion / the
assistant's tokens only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from workers.data.formats import field

SHAPES = ("text", "instruction", "chat")


@dataclass(frozen=True)
class ShapeOptions:
    """How rows become samples (the data spec's fields that matter here)."""

    shape: str = "text"
    seq_len: int = 128
    truncate: bool = False
    text_field: str = "text"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"

    @classmethod
    def of(cls, data) -> ShapeOptions:
        """The options a job spec's ``data`` section sets."""
        return cls(**{name: getattr(data, name) for name in cls.__dataclass_fields__})


@dataclass
class Samples:
    """Flat arrays of ``num_samples * (seq_len + 1)`` tokens and targets (None: all targets)."""

    tokens: np.ndarray
    targets: np.ndarray | None
    num_samples: int


def tokenize_rows(
    tok, rows: Iterable[tuple[int, object]], opts: ShapeOptions, path: str
) -> Samples:
    """The samples of ``rows`` (from :func:`workers.data.formats.read_rows`) in ``opts.shape``."""
    if opts.shape == "text":
        return _pack(tok, rows, opts, path)
    if opts.shape not in SHAPES:
        raise ValueError(f"unknown data.shape {opts.shape!r}; set one of: {', '.join(SHAPES)}")
    encode = _instruction if opts.shape == "instruction" else _chat
    window = opts.seq_len + 1
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens, targets = [], []
    for row, record in rows:
        ids, flags = encode(tok, record, opts, path, row)
        if len(ids) > window:
            if not opts.truncate:
                raise ValueError(
                    f"data.path {path!r} row {row}: the sample is {len(ids)} tokens, longer "
                    f"than seq_len + 1 = {window}; set data.truncate: true or raise data.seq_len"
                )
            ids, flags = ids[:window], flags[:window]
        fill = window - len(ids)
        tokens.append(np.asarray(ids + [pad] * fill, dtype=np.uint32))
        targets.append(np.asarray(flags + [0] * fill, dtype=np.uint8))
    if not tokens:
        raise ValueError(f"data.path {path!r} holds no rows; it needs at least one sample")
    return Samples(np.concatenate(tokens), np.concatenate(targets), len(tokens))


def _pack(tok, rows: Iterable[tuple[int, object]], opts: ShapeOptions, path: str) -> Samples:
    window = opts.seq_len + 1
    parts: list[np.ndarray] = []
    eos = np.asarray([tok.eos_token_id], dtype=np.uint32)
    for n, (row, record) in enumerate(rows):
        text = field(path, row, record, opts.text_field, str, "text")
        if n:
            parts.append(eos)
        parts.append(np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.uint32))
    stream = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    count = len(stream) // window
    if count == 0:
        raise ValueError(
            f"data.path {path!r} holds {len(stream)} tokens, fewer than one sample needs "
            f"(seq_len + 1 = {window}); use more data or reduce data.seq_len"
        )
    return Samples(np.ascontiguousarray(stream[: count * window]), None, count)


def _instruction(tok, record, opts: ShapeOptions, path: str, row: int):
    prompt = field(path, row, record, opts.prompt_field, str, "prompt")
    completion = field(path, row, record, opts.completion_field, str, "completion")
    p = tok(prompt, add_special_tokens=True)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + c, [0] * len(p) + [1] * len(c)


def _chat(tok, record, opts: ShapeOptions, path: str, row: int):
    messages = field(path, row, record, opts.messages_field, list, "messages")
    where = f"data.path {path!r} row {row}"
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: each message needs a string 'role' and 'content'")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message, so nothing to train on")
    if not tok.chat_template:
        raise ValueError(
            "data.shape chat needs a tokenizer with a chat template (tokenizer_config.json "
            "'chat_template' or chat_template.jinja in model.tokenizer)"
        )
    text = _render(tok, messages, generation=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = list(_assistant_spans(tok, messages, text, where))
    # A token is trained on when it starts inside a reply (spans are character ranges, so
    # a BPE merge across the reply's first boundary cannot shift them).
    flags = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), flags


def _render(tok, messages: list, *, generation: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _assistant_spans(tok, messages: list, text: str, where: str) -> Iterator[tuple[int, int]]:
    """Character ranges of the assistant replies in ``text``: rendering the conversation up
    to a reply with the generation prompt gives its start, up to and including it its end."""
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = _render(tok, messages[:k], generation=True) if k else ""
        upto = _render(tok, messages[: k + 1], generation=False)
        if not text.startswith(upto) or not upto.startswith(prefix):
            raise ValueError(
                f"{where}: the chat template does not render conversations prefix by prefix "
                "(a later message changes earlier text), so assistant tokens cannot be found"
            )
        yield len(prefix), len(upto)
