"""Generation on etrain's decoder equals transformers' generate, from a Hugging Face folder
and from a job's checkpoint (full and LoRA); sampling is seeded and bounded."""

from __future__ import annotations

import io
import json
import time

import pytest
import torch
import transformers

from tests.support.generation import LORA, perturb, save_checkpoint
from tests.unit.workers.generate.conftest import FAMILIES
from workers.checkpoint.export import export_checkpoint
from workers.checkpoint.export_lora import export_merged
from workers.checkpoint.source import ExportError
from workers.generate import load
from workers.generate.params import GenerateRequest, SamplingParams
from workers.generate.run import complete, main, run
from workers.generate.sampling import Decoding, generate, top_p_filter
from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.models.lora import hf_fingerprint, inject_lora, is_lora_param
from workers.spec.model import LoraSpec

PROMPT = "The quick brown fox"
N = 12


def hf_greedy(folder, prompt_ids: list[int], n: int = N, **kwargs) -> list[int]:
    """transformers' greedy continuation of ``prompt_ids`` (the new tokens only)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, **kwargs
    )
    return out[0, len(prompt_ids) :].tolist()


def prompt_ids(folder, text: str = PROMPT) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return tok(text)["input_ids"]


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_from_a_folder_equals_transformers(hf_folders, arch):
    folder = hf_folders[arch]
    model, tok = load.model_from_folder(str(folder)), load.folder_tokenizer(str(folder))
    got = complete(model, tok, SamplingParams(prompt=PROMPT, max_new_tokens=N), eos_ids=set())
    want = hf_greedy(folder, prompt_ids(folder))
    assert got["prompt_tokens"] == len(prompt_ids(folder))
    assert got["tokens"] == want and len(want) == N
    assert got["stop_reason"] == "max_new_tokens" and got["seed"] is None
    assert got["text"] == tok.decode(want, skip_special_tokens=True)


def test_generation_stops_at_eos_as_transformers_does(hf_folders):
    folder = hf_folders["llama"]
    model = load.model_from_folder(str(folder))
    ids = prompt_ids(folder)
    free = generate(model, ids, Decoding(max_new_tokens=N))
    eos = free.tokens[4]  # a token it emits on the way: call it the end
    stopped = generate(model, ids, Decoding(max_new_tokens=N, eos_ids=frozenset({eos})))
    first = free.tokens.index(eos)
    assert stopped.tokens == free.tokens[: first + 1] and stopped.stop_reason == "eos"
    assert stopped.tokens == hf_greedy(folder, ids, eos_token_id=eos)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_from_a_job_checkpoint_equals_transformers_on_its_export(hf_folders, arch, tmp_path):
    folder = hf_folders[arch]
    tuned = load.model_from_folder(str(folder))
    perturb(tuned, seed=1)
    uri = save_checkpoint(tuned, tmp_path / "ckpts", step=3, extra={})
    spec = {"model": {"hf": str(folder)}, "checkpoint": {"storage": f"file://{tmp_path}"}}
    answer = run(GenerateRequest(prompt=PROMPT, max_new_tokens=N, spec=spec, checkpoint_uri=uri))
    export_checkpoint(uri, tmp_path / "out", hf=str(folder))
    assert answer["tokens"] == hf_greedy(tmp_path / "out", prompt_ids(folder))
    assert answer["tokens"] != hf_greedy(folder, prompt_ids(folder)), "the tuning changed nothing"


def test_a_lora_checkpoint_generates_as_its_merged_export(tmp_path):
    spec = {
        "model": {"preset": "gpt-tiny", "lora": LORA},
        "checkpoint": {"storage": f"file://{tmp_path}"},
    }
    net = inject_lora(build_model(get_model_config("gpt-tiny"), seed=3), LoraSpec(**LORA))
    perturb(net, seed=2, only=is_lora_param)
    base = {"preset": "gpt-tiny", "seed": 3}
    uri = save_checkpoint(net, tmp_path / "ckpts", step=2, extra={"lora_base": base})
    loaded = load.model_from_checkpoint(spec, uri)
    tokens = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), net.eval()(tokens), rtol=0, atol=0)
    answer = run(GenerateRequest(prompt="hello", max_new_tokens=8, spec=spec, checkpoint_uri=uri))
    export_merged(uri, tmp_path / "merged", lora=LORA)
    assert answer["tokens"] == hf_greedy(tmp_path / "merged", list(b"hello"), 8)
    assert answer["prompt_tokens"] == 5  # a preset job without a tokenizer reads bytes


def test_top_p_sampling_is_seeded_and_bounded(hf_folders):
    folder = hf_folders["llama"]
    model, tok = load.model_from_folder(str(folder)), load.folder_tokenizer(str(folder))

    def sample(**kw):
        params = SamplingParams(prompt=PROMPT, max_new_tokens=10, **kw)
        return complete(model, tok, params, eos_ids=set())

    a, b = sample(top_p=0.9, temperature=1.5, seed=11), sample(top_p=0.9, temperature=1.5, seed=11)
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 10 and a["seed"] == 11
    others = [sample(top_p=0.9, temperature=1.5, seed=s)["tokens"] for s in range(12, 16)]
    assert any(o != a["tokens"] for o in others), "the seed does not change the draw"
    # A nucleus of one token is the greedy choice, whatever the seed.
    greedy = sample()["tokens"]
    assert sample(top_p=1e-6, seed=5)["tokens"] == greedy
    unseeded = sample(temperature=1.0)
    assert unseeded["seed"] is not None
    assert sample(temperature=1.0, seed=unseeded["seed"])["tokens"] == unseeded["tokens"]


def test_sampling_stops_at_eos_and_at_the_deadline(hf_folders):
    model = load.model_from_folder(str(hf_folders["llama"]))
    every = frozenset(range(384))
    out = generate(model, [5, 6, 7], Decoding(max_new_tokens=9, greedy=False, eos_ids=every))
    assert len(out.tokens) == 1 and out.stop_reason == "eos"
    late = generate(model, [5, 6, 7], Decoding(max_new_tokens=9, deadline=time.monotonic()))
    assert late.tokens == [] and late.stop_reason == "time"
    full = generate(model, list(range(120)), Decoding(max_new_tokens=50))
    assert len(full.tokens) == 8 and full.stop_reason == "max_seq_len"  # 128 positions


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([0.2, 0.5, 0.3])
    assert top_p_filter(probs, 0.6).tolist() == pytest.approx([0.0, 0.5, 0.3])
    assert top_p_filter(probs, 0.5).tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert top_p_filter(probs, 1.0).tolist() == pytest.approx([0.2, 0.5, 0.3])


def test_chat_prompts_render_with_the_tokenizers_template(hf_folders):
    folder = str(hf_folders["qwen2"])
    tok = load.folder_tokenizer(folder)
    ids = load.encode_prompt(tok, "what is two plus two?", chat=True)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "what is two plus two?"}]
    want = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert ids == list(want)
    assert reference.decode(ids).endswith("<|assistant|>")
    with pytest.raises(ValueError, match="no chat template"):
        load.encode_prompt(load.ByteTokenizer(), "hi", chat=True)


def test_greedy_and_sampling_fields_do_not_mix():
    with pytest.raises(ValueError, match="greedy decoding takes no top_p, seed"):
        SamplingParams(prompt="x", greedy=True, top_p=0.5, seed=1)
    assert SamplingParams(prompt="x").sampling is False
    assert SamplingParams(prompt="x", seed=3).sampling is False  # seed alone: still greedy
    assert SamplingParams(prompt="x", temperature=0.7).sampling is True
    assert SamplingParams(prompt="x", greedy=False).sampling is True
    assert SamplingParams(prompt="x").new_tokens(16) == 16
    with pytest.raises(ValueError, match="checkpoint_uri"):
        GenerateRequest(prompt="x")


def test_the_process_entry_answers_json(hf_folders):
    request = GenerateRequest(prompt=PROMPT, max_new_tokens=3, model_dir=str(hf_folders["llama"]))
    out = io.StringIO()
    assert main(io.StringIO(request.model_dump_json()), out) == 0
    answer = json.loads(out.getvalue())
    assert len(answer["tokens"]) == 3 and answer["load_s"] >= 0
    out = io.StringIO()
    missing = request.model_copy(update={"model_dir": "/nonexistent/model"})
    assert main(io.StringIO(missing.model_dump_json()), out) == 2
    refused = json.loads(out.getvalue())
    assert refused["refused"] is True and "/nonexistent/model" in refused["error"]


def test_a_lora_checkpoint_on_a_model_hf_base_checks_the_base(hf_folders, tmp_path):
    import shutil

    folder = tmp_path / "base"
    shutil.copytree(hf_folders["qwen2"], folder)
    spec = {
        "model": {"hf": str(folder), "lora": LORA},
        "checkpoint": {"storage": f"file://{tmp_path}"},
    }
    net = inject_lora(load.model_from_folder(str(folder)), LoraSpec(**LORA))
    perturb(net, seed=6, only=is_lora_param)
    base = {"hf": str(folder), "fingerprint": hf_fingerprint(str(folder))}
    uri = save_checkpoint(net, tmp_path / "ckpts", step=2, extra={"lora_base": base})
    answer = run(GenerateRequest(prompt=PROMPT, max_new_tokens=N, spec=spec, checkpoint_uri=uri))
    assert answer["tokens"] == generate(net.eval(), prompt_ids(folder), Decoding(N)).tokens
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    with pytest.raises(ExportError, match="changed since the adapters"):
        load.model_from_checkpoint(spec, uri)
