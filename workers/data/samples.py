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
from jinja2 import TemplateError

from workers.data import chat_template
from workers.data.formats import check_messages, field, preference_row

SHAPES = ("text", "instruction", "chat", "preference")


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
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    # data.chat_template: a named template of the tokenizer, or a file's template text.
    chat_template: str | None = None

    @classmethod
    def of(cls, data) -> ShapeOptions:
        """The options a job spec's ``data`` section sets (a chat template file is read
        here, through the job's roots: :mod:`workers.data.chat_template`)."""
        given = {name: getattr(data, name) for name in cls.__dataclass_fields__}
        field = f"{getattr(data, 'section', 'data')}.chat_template"
        given["chat_template"] = chat_template.resolve(data.chat_template, field=field)
        return cls(**given)


@dataclass
class Samples:
    """Flat arrays of ``num_samples * (seq_len + 1)`` tokens and targets (None: all targets)."""

    tokens: np.ndarray
    targets: np.ndarray | None
    num_samples: int


def tokenize_rows(
    tok, rows: Iterable[tuple[int, object]], opts: ShapeOptions, path: str, *, section: str = "data"
) -> Samples:
    """The samples of ``rows`` (from :func:`workers.data.formats.read_rows`) in ``opts.shape``;
    errors name ``section``'s fields (data or data.eval)."""
    if opts.shape == "text":
        return _pack(tok, rows, opts, path, section)
    if opts.shape not in SHAPES:
        raise ValueError(f"unknown {section}.shape {opts.shape!r}; set one of: {', '.join(SHAPES)}")
    encode = {"instruction": _instruction, "chat": _chat, "preference": _preference}[opts.shape]
    window = opts.seq_len + 1
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens, targets = [], []
    for row, record in rows:
        encoded = encode(tok, record, opts, path, row, section)
        # A preference row is two samples, chosen then rejected (consecutive: a pair).
        for ids, flags in encoded if opts.shape == "preference" else [encoded]:
            if len(ids) > window:
                if not opts.truncate:
                    raise ValueError(
                        f"{section}.path {path!r} row {row}: the sample is {len(ids)} tokens, "
                        f"longer than seq_len + 1 = {window}; set {section}.truncate: true or "
                        "raise data.seq_len"
                    )
                ids, flags = ids[:window], flags[:window]
            fill = window - len(ids)
            tokens.append(np.asarray(ids + [pad] * fill, dtype=np.uint32))
            targets.append(np.asarray(flags + [0] * fill, dtype=np.uint8))
    if not tokens:
        raise ValueError(f"{section}.path {path!r} holds no rows; it needs at least one sample")
    return Samples(np.concatenate(tokens), np.concatenate(targets), len(tokens))


def _pack(
    tok, rows: Iterable[tuple[int, object]], opts: ShapeOptions, path: str, section: str
) -> Samples:
    window = opts.seq_len + 1
    parts: list[np.ndarray] = []
    eos = np.asarray([tok.eos_token_id], dtype=np.uint32)
    for n, (row, record) in enumerate(rows):
        text = field(path, row, record, opts.text_field, str, "text", section=section)
        if n:
            parts.append(eos)
        parts.append(np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.uint32))
    stream = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    count = len(stream) // window
    if count == 0:
        raise ValueError(
            f"{section}.path {path!r} holds {len(stream)} tokens, fewer than one sample needs "
            f"(seq_len + 1 = {window}); use more data or reduce data.seq_len"
        )
    return Samples(np.ascontiguousarray(stream[: count * window]), None, count)


def _instruction(tok, record, opts: ShapeOptions, path: str, row: int, section: str):
    prompt = field(path, row, record, opts.prompt_field, str, "prompt", section=section)
    completion = field(path, row, record, opts.completion_field, str, "completion", section=section)
    p = tok(prompt, add_special_tokens=True)["input_ids"]
    c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + c, [0] * len(p) + [1] * len(c)


def _preference(tok, record, opts: ShapeOptions, path: str, row: int, section: str):
    """``[(chosen ids, flags), (rejected ids, flags)]``: the prompt then each answer; only
    the answers' tokens are counted."""
    prompt, chosen, rejected = preference_row(path, row, record, opts, section=section)
    if isinstance(prompt, str):
        p = tok(prompt, add_special_tokens=True)["input_ids"]
        answers = [
            tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for a in (chosen, rejected)
        ]
        return [(p + a, [0] * len(p) + [1] * len(a)) for a in answers]
    return [
        _chat_tokens(tok, prompt + answer, opts, path, row, section, first=len(prompt))
        for answer in (chosen, rejected)
    ]


def _chat(tok, record, opts: ShapeOptions, path: str, row: int, section: str):
    messages = field(path, row, record, opts.messages_field, list, "messages", section=section)
    check_messages(messages, f"{section}.path {path!r} row {row}")
    return _chat_tokens(tok, messages, opts, path, row, section, first=0)


def _chat_tokens(
    tok, messages: list, opts: ShapeOptions, path: str, row: int, section: str, *, first: int
):
    """The conversation's ids, and flags on the tokens of assistant messages from index
    ``first`` on."""
    where = f"{section}.path {path!r} row {row}"
    template = opts.chat_template
    if template is None and not tok.chat_template:
        raise ValueError(
            f"{section}.shape chat needs a tokenizer with a chat template (tokenizer_config.json "
            f"'chat_template' or chat_template.jinja in model.tokenizer), or "
            f"{section}.chat_template"
        )
    if template is not None and chat_template.NAME_LIKE.fullmatch(template):
        chat_template.check_named(tok, template, field=f"{section}.chat_template")
    try:
        text = _render(tok, messages, generation=False, template=template)
        spans = list(_assistant_spans(tok, messages, text, where, template, first=first))
    except TemplateError as e:  # a sandbox refusal (SecurityError), an undefined name, ...
        which = f"{section}.chat_template" if template is not None else "the tokenizer's template"
        raise ValueError(f"{where}: {which} failed to render: {e}") from None
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    # A token is trained on when it starts inside a reply (spans are character ranges, so
    # a BPE merge across the reply's first boundary cannot shift them).
    flags = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), flags


def _render(tok, messages: list, *, generation: bool, template: str | None) -> str:
    return tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation, chat_template=template
    )


def _assistant_spans(
    tok, messages: list, text: str, where: str, template: str | None, *, first: int = 0
) -> Iterator[tuple[int, int]]:
    """Character ranges of the assistant replies from message ``first`` on in ``text``:
    rendering the conversation up to a reply with the generation prompt gives its start, up
    to and including it its end."""
    for k, m in enumerate(messages):
        if m["role"] != "assistant" or k < first:
            continue
        prefix = _render(tok, messages[:k], generation=True, template=template) if k else ""
        upto = _render(tok, messages[: k + 1], generation=False, template=template)
        if not text.startswith(upto) or not upto.startswith(prefix):
            raise ValueError(
                f"{where}: the chat template does not render conversations prefix by prefix "
                "(a later message changes earlier text), so assistant tokens cannot be found"
            )
        yield len(prefix), len(upto)
