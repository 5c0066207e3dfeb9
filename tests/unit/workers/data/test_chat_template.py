"""data.chat_template: a named template of the tokenizer or a Jinja file of the tenant's,
read through the job's roots, parsed and rendered in Jinja's sandbox."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.unit.workers.data.conftest import CHATS, write_jsonl
from workers.data import dataset_for
from workers.data.chat_template import MAX_TEMPLATE_BYTES, read_template
from workers.spec.data import DataSpec
from workers.storage.confine import ConfinementError, Roots

PLAIN = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SHOUTING = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


@pytest.fixture
def chats(tmp_path, monkeypatch):
    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path / "cache"))
    return write_jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in CHATS])


def _dataset(path: str, tokenizer: str, **data):
    spec = DataSpec(source="jsonl", path=path, shape="chat", seq_len=96, **data)
    return dataset_for(spec, tokenizer=tokenizer, vocab_size=None, seed=0)


def _without_template(folder: str, to) -> str:
    shutil.copytree(folder, to)
    os.unlink(to / "chat_template.jinja")
    return str(to)


def test_a_template_file_renders_a_tokenizer_that_has_none(tmp_path, bpe_tokenizer, chats):
    folder, tok = bpe_tokenizer
    bare = _without_template(folder, tmp_path / "bare")
    with pytest.raises(ValueError, match=r"data\.chat_template"):
        _dataset(chats, bare)  # no template anywhere: the message says where to give one
    template = tmp_path / "plain.jinja"
    template.write_text(PLAIN)
    ds = _dataset(chats, bare, chat_template=str(template))
    for i, messages in enumerate(CHATS):
        tokens, labels = ds[i]
        rendered = tok.apply_chat_template(messages, tokenize=False, chat_template=PLAIN)
        assert rendered.startswith("<|system|>Be brief.</s>") or i == 1
        assert tok.decode(tokens[: len(tok(rendered)["input_ids"])]) == rendered
        replies = "".join(m["content"] + "</s>" for m in messages if m["role"] == "assistant")
        assert tok.decode(labels[labels != -100].tolist()) == replies
    # Another file's text is another cache entry: the samples follow the template.
    template.write_text(SHOUTING)
    again = _dataset(chats, bare, chat_template=str(template))
    assert tok.decode(again[1][0][:12]).startswith("USER: Hello")


def test_a_named_template_of_the_tokenizer_is_chosen_by_name(tmp_path, bpe_tokenizer, chats):
    folder, tok = bpe_tokenizer
    named = _without_template(folder, tmp_path / "named")
    config = json.loads((tmp_path / "named" / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": PLAIN},
        {"name": "shout", "template": SHOUTING},
    ]
    (tmp_path / "named" / "tokenizer_config.json").write_text(json.dumps(config))
    ds = _dataset(chats, named, chat_template="shout")
    assert tok.decode(ds[1][0][:12]).startswith("USER: Hello")
    with pytest.raises(ValueError, match=r"data\.chat_template 'chatml' .* default, shout"):
        _dataset(chats, named, chat_template="chatml")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{% for m in messages %}{{ m['content'] }", "does not parse (line 1"),
        # The sandbox refuses to reach Python internals through a template.
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed to render"),
    ],
)
def test_a_bad_or_unsafe_template_is_an_error_naming_the_field(
    tmp_path, bpe_tokenizer, chats, text, words
):
    folder, _ = bpe_tokenizer
    template = tmp_path / "bad.jinja"
    template.write_text(text)
    with pytest.raises(ValueError, match=r"data\.chat_template") as info:
        _dataset(chats, folder, chat_template=str(template))
    assert words in str(info.value)


def test_a_template_file_is_read_only_through_the_roots_and_bounded(tmp_path):
    area, outside = tmp_path / "area", tmp_path / "outside"
    area.mkdir()
    outside.mkdir()
    (outside / "t.jinja").write_text(PLAIN)
    os.symlink(outside / "t.jinja", area / "link.jinja")
    os.mkfifo(area / "pipe.jinja")
    roots = Roots.of([str(area)])
    for name in ("link.jinja", "pipe.jinja"):
        with pytest.raises(ConfinementError, match=r"data\.chat_template"):
            read_template(str(area / name), field="data.chat_template", roots=roots)
    (area / "big.jinja").write_text("x" * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(ConfinementError, match="limit"):
        read_template(str(area / "big.jinja"), field="data.chat_template", roots=roots)
    (area / "ok.jinja").write_text(PLAIN)
    assert read_template(str(area / "ok.jinja"), field="data.chat_template", roots=roots) == PLAIN
