"""`etrain generate --model DIR` in the CLI's process: transformers' greedy tokens; and the
argument mistakes it names (tests/integration/test_generate_service.py runs it on jobs)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

from service import cli
from tests.support.hf_fixtures import make_hf_folder

PROMPT = "Question: what is two plus two?"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-gen") / "tiny"
    make_hf_folder(path, "mistral", seed=2)
    return path


def etrain(*args: str):
    return CliRunner().invoke(cli.app, ["generate", *args], env={"ETRAIN_URL": "http://x.test"})


def test_generate_from_a_folder_equals_transformers(folder):
    result = etrain("--model", str(folder), "--prompt", PROMPT, "--max-new-tokens", "7", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    want = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False
    )
    assert answer["tokens"] == want[0, ids.shape[1] :].tolist()
    assert answer["step"] is None and answer["prompt_tokens"] == ids.shape[1]

    text = etrain("--model", str(folder), "--prompt", PROMPT, "--max-new-tokens", "7")
    assert text.exit_code == 0, text.output
    assert text.stdout.strip() == answer["text"].strip()
    assert f"7 tokens from {folder}, stopped at max_new_tokens" in text.stderr


def test_seeded_sampling_repeats_and_reports_its_seed(folder):
    args = ("--model", str(folder), "--prompt", PROMPT, "--top-p", "0.9", "--json")
    first, again = etrain(*args, "--seed", "4"), etrain(*args, "--seed", "4")
    assert json.loads(first.stdout)["tokens"] == json.loads(again.stdout)["tokens"]
    unseeded = json.loads(etrain(*args, "--max-new-tokens", "3").stdout)
    assert isinstance(unseeded["seed"], int) and len(unseeded["tokens"]) <= 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--prompt", "x"), "pass a job id or --model DIR"),
        (("--model", "/m", "--prompt", "x", "--step", "2"), "--step picks a job's checkpoint"),
        (("--model", "/m", "--prompt", "x", "--top-p", "2"), "less than or equal to 1"),
        (("--model", "/nonexistent/m", "--prompt", "x"), "/nonexistent/m"),
    ],
)
def test_mistakes_are_named(args, message):
    result = etrain(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
