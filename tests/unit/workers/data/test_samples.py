"""Tokenized datasets: shapes, prepared shards, the sampler on them, and bad data."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.unit.workers.data.conftest import CHATS, INSTRUCTIONS, write_jsonl
from workers.data import GlobalBatchSampler, TokenDataset, collate, dataset_for, shard_global_batch
from workers.data.prepare import prepare, read_index
from workers.data.remote import cache_root
from workers.data.samples import ShapeOptions
from workers.spec.data import DataSpec, EvalDataSpec

DOCS = ["The quick brown fox.", "Hello world!", "Elastic training resumes exactly."]


def prep(tmp_path, tok_dir, rows, *, source="jsonl", vocab_size=None, **opts) -> TokenDataset:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = rows if isinstance(rows, str) else write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "prepared"
    prepare(
        source=source,
        path=path,
        tokenizer=tok_dir,
        opts=ShapeOptions(**opts),
        out=str(out),
        vocab_size=vocab_size,
    )
    return TokenDataset(str(out))


def test_text_packs_documents_with_eos_between(tmp_path, bpe_tokenizer):
    folder, tok = bpe_tokenizer
    ds = prep(tmp_path, folder, [{"text": d} for d in DOCS], seq_len=8)
    ids = [tok(d, add_special_tokens=False)["input_ids"] for d in DOCS]
    stream = ids[0] + [tok.eos_token_id] + ids[1] + [tok.eos_token_id] + ids[2]
    assert len(ds) == len(stream) // 9 and not ds.masked
    got = torch.cat([ds[i] for i in range(len(ds))]).tolist()
    assert got == stream[: len(ds) * 9]  # non-overlapping windows, the tail dropped
    x, y = collate(ds, [(0, 1), (0, 0)])
    assert torch.equal(y[0], ds[1][1:]) and torch.equal(x[1], ds[0][:-1])


def test_instruction_trains_on_completion_tokens_only(tmp_path, bpe_tokenizer):
    folder, tok = bpe_tokenizer
    ds = prep(tmp_path, folder, INSTRUCTIONS, shape="instruction", seq_len=32)
    assert len(ds) == len(INSTRUCTIONS) and ds.masked
    for i, row in enumerate(INSTRUCTIONS):
        tokens, labels = ds[i]
        n_prompt = len(tok(row["prompt"])["input_ids"])
        completion = tok(row["completion"], add_special_tokens=False)["input_ids"]
        end = n_prompt + len(completion) + 1
        # label t predicts token t+1: prompt tokens are never targets, padding neither.
        assert (labels[: n_prompt - 1] == -100).all() and (labels[end - 1 :] == -100).all()
        assert labels[n_prompt - 1 : end - 1].tolist() == [*completion, tok.eos_token_id]
        assert ds.counted(i) == len(completion) + 1
        assert (tokens[end:] == tok.pad_token_id).all()


def test_chat_trains_on_assistant_tokens_only(tmp_path, bpe_tokenizer):
    folder, tok = bpe_tokenizer
    ds = prep(tmp_path, folder, [{"messages": m} for m in CHATS], shape="chat", seq_len=64)
    for i, messages in enumerate(CHATS):
        tokens, labels = ds[i]
        trained = labels[labels != -100].tolist()
        replies = "".join(m["content"] + "</s>" for m in messages if m["role"] == "assistant")
        assert tok.decode(trained) == replies
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(tokens[: len(tok(rendered)["input_ids"])]) == rendered


PREFERENCES = [
    {"prompt": "Question: what is two plus two?", "chosen": " four.", "rejected": " five."},
    {"prompt": "Hello world!", "chosen": " Hello!", "rejected": " The quick brown fox."},
]


def test_preference_rows_are_chosen_then_rejected_samples(tmp_path, bpe_tokenizer):
    folder, tok = bpe_tokenizer
    ds = prep(tmp_path, folder, PREFERENCES, shape="preference", seq_len=32)
    assert len(ds) == 2 * len(PREFERENCES) and ds.masked
    for i, row in enumerate(PREFERENCES):
        for j, answer in enumerate((row["chosen"], row["rejected"])):
            tokens, labels = ds[2 * i + j]
            prompt = tok(row["prompt"])["input_ids"]
            want = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert tokens[: len(prompt)].tolist() == prompt  # the same prompt, not counted
            assert labels[labels != -100].tolist() == want
            assert ds.counted(2 * i + j) == len(want)


def test_chat_preference_counts_only_the_answer(tmp_path, bpe_tokenizer):
    """A chat prompt's earlier assistant turn is context, not trained on; an answer may be a
    string, a message or a list of messages."""
    folder, tok = bpe_tokenizer
    prompt = CHATS[0][:4]
    rows = [
        {"prompt": prompt, "chosen": CHATS[0][4], "rejected": "Hello!"},
        {"prompt": prompt, "chosen": [CHATS[0][4]], "rejected": [CHATS[1][1]]},
    ]
    ds = prep(tmp_path, folder, rows, shape="preference", seq_len=96)
    answers = [CHATS[0][4]["content"], "Hello!"]
    for i in range(4):
        tokens, labels = ds[i]
        assert tok.decode(labels[labels != -100].tolist()) == answers[i % 2] + "</s>"
        rendered = tok.apply_chat_template(
            [*prompt, {"role": "assistant", "content": answers[i % 2]}], tokenize=False
        )
        assert tok.decode(tokens[: len(tok(rendered)["input_ids"])]) == rendered


def test_parquet_reads_like_jsonl(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(INSTRUCTIONS), path)
    from_parquet = prep(tmp_path / "p", folder, str(path), source="parquet", shape="instruction")
    from_jsonl = prep(tmp_path / "j", folder, INSTRUCTIONS, shape="instruction")
    for i in range(len(INSTRUCTIONS)):
        assert all(torch.equal(a, b) for a, b in zip(from_parquet[i], from_jsonl[i], strict=True))


def test_index_names_source_and_tokenizer(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    prep(tmp_path, folder, INSTRUCTIONS, shape="instruction", seq_len=32)
    index = read_index(str(tmp_path / "prepared"))
    src = tmp_path / "rows.jsonl"
    assert index["source"]["name"] == "rows.jsonl" and index["source"]["size"] == src.stat().st_size
    assert len(index["tokenizer"]["sha256"]) == 64 and index["seq_len"] == 32
    tokens = np.load(tmp_path / "prepared" / "tokens.npy", mmap_mode="r")
    assert tokens.dtype == np.uint32 and len(tokens) == 4 * 33


@pytest.mark.parametrize(
    "rows, opts, message",
    [
        (['{"text": "ok"}', "{not json"], {}, "line 2: invalid JSON"),
        (['{"text": "ok"}', "[" * 200_000], {}, "line 2: JSON nested too deeply"),
        ([{"text": "ok"}, {"body": "x"}], {}, "row 2: no field 'text'"),
        ([{"prompt": "p"}], {"shape": "instruction"}, "row 1: no field 'completion'"),
        ([{"messages": [{"role": "user", "content": "hi"}]}], {"shape": "chat"}, "no assistant"),
        (INSTRUCTIONS, {"shape": "instruction", "seq_len": 8}, "row 1: the sample is"),
        ([{"prompt": "p", "chosen": "a"}], {"shape": "preference"}, "row 1: no field 'rejected'"),
        (
            [{"prompt": "p", "chosen": "a", "rejected": ["b"]}],
            {"shape": "preference"},
            "row 1: field 'rejected' must be a string",
        ),
        (
            [{"prompt": [{"role": "user", "content": "hi"}], "chosen": "a", "rejected": []}],
            {"shape": "preference"},
            "row 1 field 'rejected': no assistant message",
        ),
        (
            [{"prompt": [{"content": "hi"}], "chosen": "a", "rejected": "b"}],
            {"shape": "preference"},
            "row 1 field 'prompt': each message needs a string 'role'",
        ),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path, bpe_tokenizer, rows, opts, message):
    folder, _ = bpe_tokenizer
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        prep(tmp_path, folder, str(path), **opts)
    assert str(path) in str(e.value)


def test_missing_file_and_truncation(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    with pytest.raises(ValueError, match=r"data\.path .*nope\.jsonl.* does not exist"):
        prep(tmp_path, folder, str(tmp_path / "nope.jsonl"))
    ds = prep(tmp_path, folder, INSTRUCTIONS, shape="instruction", seq_len=8, truncate=True)
    assert len(ds) == 4 and ds[0][0].shape == (9,) and ds[0][1].shape == (8,)


SECTIONS = {"data": DataSpec, "data.eval": EvalDataSpec}


def spec(section: str = "data", **data) -> DataSpec | EvalDataSpec:
    """The spec section ``section`` (data, or the evaluation source data.eval) of ``data``."""
    return SECTIONS[section].model_validate(data)


def test_dataset_for_prepares_once_and_reuses_the_cache(tmp_path, bpe_tokenizer, monkeypatch):
    folder, _ = bpe_tokenizer
    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path / "cache"))
    path = write_jsonl(tmp_path / "rows.jsonl", INSTRUCTIONS)
    data = spec(source="jsonl", path=path, shape="instruction", seq_len=32)
    first = dataset_for(data, tokenizer=folder, vocab_size=512, seed=0)
    cache = Path(cache_root())  # this tenant's folder of the node cache
    assert cache.parent == tmp_path / "cache"
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    stamp = os.stat(entry / "tokens.npy").st_mtime_ns
    again = dataset_for(data, tokenizer=folder, vocab_size=512, seed=0)
    assert os.stat(entry / "tokens.npy").st_mtime_ns == stamp
    assert torch.equal(first[2][1], again[2][1])
    other = dataset_for(
        data.model_copy(update={"seq_len": 48}), tokenizer=folder, vocab_size=512, seed=0
    )
    assert other.seq_len == 48 and len([p for p in cache.iterdir() if p.is_dir()]) == 2


@pytest.mark.parametrize("section", SECTIONS)
def test_dataset_for_refusals(tmp_path, bpe_tokenizer, section):
    """Each refusal names the fields of the section it was given (data.eval's for the
    evaluation source)."""
    folder, _ = bpe_tokenizer
    path = write_jsonl(tmp_path / "rows.jsonl", INSTRUCTIONS)
    shaped = spec(section, source="jsonl", path=path, shape="instruction")
    with pytest.raises(ValueError, match=re.escape(f"{section}.shape 'instruction' needs a")):
        dataset_for(shaped, tokenizer=None, vocab_size=256, seed=0)
    with pytest.raises(ValueError, match="vocab_size is 256"):
        dataset_for(shaped, tokenizer=folder, vocab_size=256, seed=0)
    prep(tmp_path, folder, INSTRUCTIONS, shape="instruction", seq_len=32)
    prepared = spec(section, source="prepared", path=str(tmp_path / "prepared"), seq_len=32)
    assert len(dataset_for(prepared, tokenizer=None, vocab_size=512, seed=0)) == 4
    with pytest.raises(ValueError, match=re.escape(f"{section}.path ")) as e:
        dataset_for(
            prepared.model_copy(update={"seq_len": 48}), tokenizer=None, vocab_size=512, seed=0
        )
    assert "set data.seq_len: 32" in str(e.value)
    with pytest.raises(ValueError, match=re.escape(f"{section}.path ") + ".* token ids up to"):
        dataset_for(prepared, tokenizer=None, vocab_size=300, seed=0)


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([*INSTRUCTIONS[:2], {"prompt": "p"}], "row 3: no field 'completion'"),
        ([*INSTRUCTIONS[:2], "{not json"], "line 3: invalid JSON"),
    ],
    ids=["missing-field", "bad-json"],
)
def test_bad_rows_are_refused_at_use_naming_the_section(
    tmp_path, bpe_tokenizer, monkeypatch, section, rows, words
):
    """A file that changed after submit (or that the service could not see) is refused by
    the workers when they tokenize it, naming the field and row, and the option to set."""
    folder, _ = bpe_tokenizer
    monkeypatch.setenv("ETRAIN_DATA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "rows.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    data = spec(section, source="jsonl", path=str(path), shape="instruction", seq_len=32)
    with pytest.raises(ValueError) as e:
        dataset_for(data, tokenizer=folder, vocab_size=512, seed=0)
    assert str(e.value).startswith(f"{section}.path {str(path)!r} {words}"), str(e.value)
    if "no field" in words:
        assert f"set {section}.completion_field" in str(e.value)


def test_sampler_on_prepared_data_resumes_exactly_and_survives_resizes(tmp_path, word_tokenizer):
    folder, _ = word_tokenizer
    rows = [{"prompt": f"Question: {i}", "completion": "Answer: four."} for i in range(30)]
    ds = prep(tmp_path, folder, rows, shape="instruction", seq_len=8)
    # A job on 3, then 2, then 6 ranks, with a save/resume through JSON at each resize.
    saved, seen, order = {"epoch": 0, "position": 0}, Counter(), []
    for dp_size, steps in ((3, 4), (2, 5), (6, 6)):
        sampler = GlobalBatchSampler(len(ds), seed=3)
        sampler.load_state_dict(json.loads(json.dumps(saved)))
        for _ in range(steps):
            batch = sampler.next_global_batch(6)
            for rank in range(dp_size):
                for micro in shard_global_batch(
                    batch, dp_rank=rank, dp_size=dp_size, micro_batch_size=1
                ):
                    seen.update(micro)
                    order.append(collate(ds, micro)[1])
        saved = sampler.state_dict()
    # 90 samples drawn = 3 epochs of 30: each sample exactly once per epoch.
    assert max(seen.values()) == 1 and {e for e, _ in seen} == {0, 1, 2}
    for epoch in range(3):
        assert sorted(i for e, i in seen if e == epoch) == list(range(30))
    # Uninterrupted on one rank: the same batches, the same labels, in the same order.
    plain = GlobalBatchSampler(len(ds), seed=3)
    again = [collate(ds, [item])[1] for _ in range(15) for item in plain.next_global_batch(6)]
    assert all(torch.equal(a, b) for a, b in zip(order, again, strict=True))


def test_template_in_tokenizer_config_and_the_hash(tmp_path, bpe_tokenizer):
    import shutil

    from workers.data.tokenizer import load_tokenizer, tokenizer_hash

    folder, tok = bpe_tokenizer
    other = tmp_path / "tok"
    shutil.copytree(folder, other)
    assert tokenizer_hash(str(other)) == tokenizer_hash(folder)
    # Older folders carry the template inside tokenizer_config.json.
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = (other / "chat_template.jinja").read_text()
    (other / "chat_template.jinja").unlink()
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(str(other)).chat_template == tok.chat_template
    assert tokenizer_hash(str(other)) != tokenizer_hash(folder)  # a new cache key
    with pytest.raises(ValueError, match=r"has no tokenizer\.json"):
        load_tokenizer(str(tmp_path))


def test_chat_spans_survive_merges_across_the_reply_boundary(tmp_path, bpe_tokenizer):
    import shutil

    folder, tok = bpe_tokenizer
    other = tmp_path / "tok"
    shutil.copytree(folder, other)
    # Role headers ending in a blank line: BPE may tokenize "\n\n" differently alone than
    # followed by the reply, so token-level prefix matching would fail here.
    (other / "chat_template.jinja").write_text(
        "{% for m in messages %}<|{{ m['role'] }}|>\n\n{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n\n{% endif %}"
    )
    ds = prep(tmp_path, str(other), [{"messages": m} for m in CHATS], shape="chat", seq_len=96)
    for i, messages in enumerate(CHATS):
        _, labels = ds[i]
        replies = "".join(m["content"] + "</s>" for m in messages if m["role"] == "assistant")
        assert tok.decode(labels[labels != -100].tolist()) == replies


def test_plain_text_is_one_document(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(DOCS))
    from_text = prep(tmp_path / "t", folder, str(text), source="text", seq_len=8)
    from_jsonl = prep(tmp_path / "j", folder, [{"text": "\n".join(DOCS)}], seq_len=8)
    assert len(from_text) == len(from_jsonl) > 1
    assert all(torch.equal(from_text[i], from_jsonl[i]) for i in range(len(from_text)))
