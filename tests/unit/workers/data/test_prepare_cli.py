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
    said = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 2
    assert "row 1: no field 'completion'" in said and "rows.jsonl" in said


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


@pytest.mark.parametrize(
    "rows, data, loc, words",
    [
        (['{"prompt": "a"', ""], {"shape": "instruction"}, ["data", "path"], "line 1: invalid"),
        ([json.dumps({"q": "a"})], {"shape": "instruction"}, ["data", "path"], "no field 'prompt'"),
        ([json.dumps({"body": "x"})], {}, ["data", "path"], "row 1: no field 'text'"),
        (
            [json.dumps({"messages": [{"role": "user", "content": "hi"}]})],
            {"shape": "chat"},
            ["data", "path"],
            "no assistant message",
        ),
    ],
)
def test_submit_refuses_bad_data_with_422(client, tmp_path, bpe_tokenizer, rows, data, loc, words):
    headers, area = _tenant(client, tmp_path)
    path = area / "rows.jsonl"
    path.write_text("\n".join(rows) + "\n")
    tok = area / "tok"
    tok.mkdir()
    spec = _job({"source": "jsonl", "path": str(path), **data}, {"tokenizer": str(tok)})
    r = client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", *loc] and words in err["msg"] and str(path) in err["msg"]


def test_submit_refuses_a_shape_without_tokenizer_and_a_wrong_seq_len(client, tmp_path):
    headers, area = _tenant(client, tmp_path)
    path = write_jsonl(area / "rows.jsonl", INSTRUCTIONS)
    r = client.post(
        "/v1/jobs", json=_job({"source": "jsonl", "path": path, "shape": "chat"}), headers=headers
    )
    assert r.status_code == 422, r.text
    assert "model.tokenizer" in r.text and "data.shape chat needs a tokenizer" in r.text
    prepared = area / "prepared"
    prepared.mkdir()
    (prepared / "index.json").write_text(json.dumps({"seq_len": 64}))
    data = {"source": "prepared", "path": str(prepared), "seq_len": 32}
    r = client.post("/v1/jobs", json=_job(data), headers=headers)
    assert r.status_code == 422 and "run `etrain data prepare` again" in r.text  # no format
    index = {"format_version": FORMAT_VERSION, "seq_len": 64}
    (prepared / "index.json").write_text(json.dumps(index))
    r = client.post("/v1/jobs", json=_job(data), headers=headers)
    assert r.status_code == 422 and "set data.seq_len: 64" in r.text
    r = client.post("/v1/jobs", json=_job({**data, "seq_len": 64}), headers=headers)
    assert r.status_code == 201, r.text


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
