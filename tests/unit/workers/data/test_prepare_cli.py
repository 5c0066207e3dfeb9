"""`etrain data prepare` (CliRunner) and the submit-time data checks (422 naming the field)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from service import cli
from tests.support.fakes import ADMIN
from tests.unit.workers.data.conftest import CHATS, INSTRUCTIONS, write_jsonl
from workers.data import TokenDataset
from workers.data.prepare import FORMAT_VERSION

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def test_prepare_from_a_spec_file_then_flags_override(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CHATS])
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "model": {"tokenizer": folder},
                "data": {"source": "jsonl", "path": path, "shape": "chat", "seq_len": 64},
            }
        )
    )
    out = tmp_path / "prepared"
    result = CliRunner().invoke(
        cli.app, ["data", "prepare", "--spec", str(spec), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "prepared 2 chat samples of 65 tokens from chat.jsonl" in result.output
    ds = TokenDataset(str(out))
    assert len(ds) == 2 and ds.masked and ds.seq_len == 64
    result = CliRunner().invoke(
        cli.app,
        ["data", "prepare", "--spec", str(spec), "--out", str(out), "--seq-len", "96"],
    )
    assert result.exit_code == 0, result.output
    assert TokenDataset(str(out)).seq_len == 96


def test_prepare_errors_exit_2_with_the_reason(tmp_path, bpe_tokenizer):
    folder, _ = bpe_tokenizer
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "p", "answer": "a"}])
    args = ["data", "prepare", "--out", str(tmp_path / "o"), "--source", "jsonl"]
    args += ["--path", path, "--shape", "instruction"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2 and "no tokenizer" in result.output
    result = CliRunner().invoke(cli.app, [*args, "--tokenizer", folder])
    said = "".join(result.output.split())  # rich wraps long lines, inside the path too
    assert result.exit_code == 2
    assert "row1:nofield'completion'" in said and "rows.jsonl" in said


def test_prepare_checks_the_tokenizer_fits_the_spec_model(tmp_path, bpe_tokenizer, word_tokenizer):
    path = write_jsonl(tmp_path / "rows.jsonl", INSTRUCTIONS)
    spec = tmp_path / "job.json"
    data = {"source": "jsonl", "path": path, "shape": "instruction", "seq_len": 32}
    out = ["--out", str(tmp_path / "o")]
    for (folder, _), code in ((bpe_tokenizer, 2), (word_tokenizer, 0)):
        spec.write_text(
            json.dumps({"model": {"preset": "gpt-tiny", "tokenizer": folder}, "data": data})
        )
        result = CliRunner().invoke(cli.app, ["data", "prepare", "--spec", str(spec), *out])
        assert result.exit_code == code, result.output
    said = " ".join(result.output.split())
    assert "prepared 4 instruction samples" in said


def _tenant(client, tmp_path, name="team-d"):
    r = client.post("/v1/tokens", json={"tenant": name, "name": "ci"}, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    area = tmp_path / "tenants" / name
    area.mkdir(parents=True, exist_ok=True)
    return {"Authorization": f"Bearer {r.json()['token']}"}, area


def _job(data: dict, model: dict | None = None) -> dict:
    return {"name": "ft", "model": model or {}, "data": data, "train": {"steps": 2}}


GOOD_ROW = json.dumps({"prompt": "p", "completion": "c"})
# The sections that name a data file: the training source and the evaluation source.
SECTIONS = {"data": ["data", "path"], "data.eval": ["data", "eval", "path"]}


def _source_in(section: str, source: dict) -> dict:
    """A job's data section with ``source`` as ``section`` (data.eval: beside synthetic
    training data)."""
    return source if section == "data" else {"eval": source}


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize(
    "rows, data, words",
    [
        (['{"prompt": "a"', ""], {"shape": "instruction"}, "line 1: invalid JSON"),
        ([GOOD_ROW, GOOD_ROW, '{"prompt": '], {"shape": "instruction"}, "line 3: invalid JSON"),
        ([json.dumps({"q": "a"})], {"shape": "instruction"}, "row 1: no field 'prompt'"),
        ([GOOD_ROW, json.dumps({"q": "a"})], {"shape": "instruction"}, "row 2: no field 'prompt'"),
        (
            [json.dumps({"prompt": "a", "answer": "b"})],
            {"shape": "instruction"},
            "row 1: no field 'completion'",
        ),
        ([json.dumps({"body": "x"})], {}, "row 1: no field 'text'"),
        (
            [json.dumps({"messages": [{"role": "user", "content": "hi"}]})],
            {"shape": "chat"},
            "no assistant message",
        ),
    ],
)
def test_submit_refuses_bad_data_with_422(
    client, tmp_path, bpe_tokenizer, section, rows, data, words
):
    headers, area = _tenant(client, tmp_path)
    path = area / "rows.jsonl"
    path.write_text("\n".join(rows) + "\n")
    tok = area / "tok"
    tok.mkdir()
    source = {"source": "jsonl", "path": str(path), **data}
    spec = _job(_source_in(section, source), {"tokenizer": str(tok)})
    r = client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", *SECTIONS[section]]
    assert words in err["msg"] and f"{section}.path {str(path)!r}" in err["msg"], err["msg"]
    option = {"prompt": "prompt_field", "completion": "completion_field", "text": "text_field"}
    for what, name in option.items():  # the fix names the section's own option
        if f"no field '{what}'" in words:
            assert f"set {section}.{name}" in err["msg"], err["msg"]


def test_submit_checks_both_sources_and_names_each(client, tmp_path, bpe_tokenizer):
    """Training data and evaluation data are checked alike: a problem in each is its own
    422 item, at its own field; a good evaluation file beside bad training data (and the
    reverse) is no item."""
    headers, area = _tenant(client, tmp_path)
    good, bad = area / "good.jsonl", area / "bad.jsonl"
    good.write_text(GOOD_ROW + "\n")
    bad.write_text(GOOD_ROW + "\n" + json.dumps({"q": "a"}) + "\n")
    tok = area / "tok"
    tok.mkdir()

    def errors(train, held_out) -> dict:
        source = {"source": "jsonl", "shape": "instruction"}
        data = {**source, "path": str(train), "eval": {**source, "path": str(held_out)}}
        r = client.post("/v1/jobs", json=_job(data, {"tokenizer": str(tok)}), headers=headers)
        if r.status_code == 201:
            return {}
        assert r.status_code == 422, r.text
        return {tuple(e["loc"][1:]): e["msg"] for e in r.json()["detail"]}

    both = errors(bad, bad)
    assert sorted(both) == [("data", "eval", "path"), ("data", "path")]
    assert both[("data", "path")].startswith(f"data.path {str(bad)!r} row 2: no field 'prompt'")
    assert both[("data", "eval", "path")].startswith(f"data.eval.path {str(bad)!r} row 2:")
    assert list(errors(good, bad)) == [("data", "eval", "path")]
    assert list(errors(bad, good)) == [("data", "path")]
    assert errors(good, good) == {}


@pytest.mark.parametrize("section", SECTIONS)
def test_submit_refuses_a_shape_without_tokenizer_and_a_wrong_seq_len(client, tmp_path, section):
    headers, area = _tenant(client, tmp_path)

    def refusal(data: dict, seq_len: int = 128) -> dict | None:
        """The one 422 item of a job whose ``section`` is ``data`` (None: it is accepted)."""
        job = _job({"seq_len": seq_len, **_source_in(section, data)})
        r = client.post("/v1/jobs", json=job, headers=headers)
        if r.status_code == 201:
            return None
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        return err

    path = write_jsonl(area / "rows.jsonl", INSTRUCTIONS)
    err = refusal({"source": "jsonl", "path": path, "shape": "chat"})
    assert err["loc"] == ["body", "model", "tokenizer"]
    assert f"{section}.shape chat needs a tokenizer" in err["msg"]
    prepared = area / "prepared"
    prepared.mkdir()
    (prepared / "index.json").write_text(json.dumps({"seq_len": 64}))
    data = {"source": "prepared", "path": str(prepared)}
    err = refusal(data, seq_len=32)
    assert err["loc"] == ["body", *SECTIONS[section]]
    assert err["msg"].startswith(f"{section}.path ")
    assert "run `etrain data prepare` again" in err["msg"]  # no format
    index = {"format_version": FORMAT_VERSION, "seq_len": 64}
    (prepared / "index.json").write_text(json.dumps(index))
    err = refusal(data, seq_len=32)
    assert err["loc"] == ["body", *SECTIONS[section]] and "set data.seq_len: 64" in err["msg"]
    assert refusal(data, seq_len=64) is None


def test_submit_reads_a_bounded_head_of_the_file(client, tmp_path, monkeypatch):
    from service.domain import data_check

    monkeypatch.setattr(data_check, "MAX_JSONL_BYTES", 200)
    headers, area = _tenant(client, tmp_path)
    good = [json.dumps({"text": "x" * 40}) for _ in range(4)]  # ~4 x 52 bytes
    path = area / "rows.jsonl"
    path.write_text("\n".join([*good, "{broken"]) + "\n")
    job = _job({"source": "jsonl", "path": str(path)})
    # The broken line lies past the bytes the service reads: the workers will name it.
    assert client.post("/v1/jobs", json=job, headers=headers).status_code == 201
    monkeypatch.setattr(data_check, "MAX_JSONL_BYTES", 1 << 20)
    r = client.post("/v1/jobs", json=job, headers=headers)
    assert r.status_code == 422 and "line 5: invalid JSON" in r.text


@pytest.mark.parametrize("section", SECTIONS)
def test_submit_refuses_a_chat_template_that_does_not_parse(client, tmp_path, section):
    headers, area = _tenant(client, tmp_path)
    rows = area / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    rows.write_text(json.dumps(chat) + "\n")
    template = area / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }")
    tok = area / "tok"
    tok.mkdir()
    source = {"source": "jsonl", "path": str(rows), "shape": "chat", "chat_template": str(template)}
    r = client.post(
        "/v1/jobs", json=_job(_source_in(section, source), {"tokenizer": str(tok)}), headers=headers
    )
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", *section.split("."), "chat_template"]
    assert err["msg"].startswith(f"{section}.chat_template: the template does not parse (line 1")
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    r = client.post(
        "/v1/jobs", json=_job(_source_in(section, source), {"tokenizer": str(tok)}), headers=headers
    )
    assert r.status_code == 201, r.text
