"""Export a real gpt-tiny checkpoint (saved by the train loop) to safetensors and load it back."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from workers.checkpoint import MANIFEST
from workers.export import ExportError, export_checkpoint, open_checkpoint_dir
from workers.hf_naming import from_hf_state_dict, to_hf_name
from workers.local_launch import LocalJob, run_local
from workers.models import build_model, get_model_config
from workers.models.llama import apply_rotary_emb
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

CFG = get_model_config("gpt-tiny")
TOKENS = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))


def tiny_spec() -> JobSpec:
    return JobSpec.model_validate({
        "name": "export", "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1},
        "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
        "checkpoint": {"every_steps": 2, "keep_last": 3},
    })


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run with committed checkpoints at steps 2 and 4; (root, final model)."""
    root = tmp_path_factory.mktemp("ckpts")
    result = run(tiny_spec(), RunEnv(rank=0, world_size=1, device=torch.device("cpu"),
                                     checkpoint_root=str(root)))
    return root, result.model


def fresh_model(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A model with other initial weights, then ``state`` loaded strictly."""
    model = build_model(CFG, seed=1234)
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model.eval()(TOKENS)


def test_export_loads_into_a_fresh_model_with_the_same_logits(trained, tmp_path):
    root, final = trained
    result = export_checkpoint(root / "step_00000004", tmp_path / "out", preset="gpt-tiny",
                               job_id="j-1")
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert list(state) == list(final.state_dict())  # etrain FQNs, in model order
    assert torch.equal(logits(fresh_model(state)), logits(final))
    assert (result.step, result.num_tensors, result.dtype) == (4, len(state), "float32")
    assert result.num_params == sum(p.numel() for p in final.parameters())

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "num_hidden_layers", "vocab_size",
                                   "max_position_embeddings", "rms_norm_eps", "rope_theta",
                                   "torch_dtype")} == {
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "torch_dtype": "float32"}
    info = json.loads((tmp_path / "out" / "etrain_export.json").read_text())
    assert info["job_id"] == "j-1" and info["step"] == 4 and info["naming"] == "etrain"
    assert info["source_uri"] == f"file://{(root / 'step_00000004').resolve()}"


@pytest.mark.parametrize("batch_bytes", [512 * 1024**2, 1])
def test_an_older_step_matches_dcp_to_torch_save(trained, tmp_path, batch_bytes):
    """Step 2 (not the final state), read in one batch or one tensor at a time."""
    root, _ = trained
    export_checkpoint(root / "step_00000002", tmp_path, preset="gpt-tiny",
                      batch_bytes=batch_bytes)
    dcp_to_torch_save(root / "step_00000002", tmp_path / "full.pt")
    reference = torch.load(tmp_path / "full.pt", weights_only=False)["app"]["model"]
    exported = load_file(tmp_path / "model.safetensors")
    assert exported.keys() == reference.keys()
    assert all(torch.equal(exported[k], reference[k]) for k in reference)


def test_only_model_tensors_are_read(trained, tmp_path, monkeypatch):
    root, _ = trained
    read: list[str] = []
    original = FileSystemReader.read_data

    def spy(self, plan, planner):
        read.extend(item.storage_index.fqn for item in plan.items)
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", spy)
    export_checkpoint(root / "step_00000004", tmp_path, preset="gpt-tiny")
    assert read and all(fqn.startswith("app.model.") for fqn in read)
    stored = FileSystemReader(str(root / "step_00000004")).read_metadata().state_dict_metadata
    assert any(k.startswith("app.optim.") for k in stored)  # there was optimizer state to skip


def test_bf16_export_is_cast_and_close(trained, tmp_path):
    root, final = trained
    export_checkpoint(root / "step_00000004", tmp_path, preset="gpt-tiny", dtype="bf16")
    state = load_file(tmp_path / "model.safetensors")
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    restored = fresh_model({k: v.float() for k, v in state.items()})
    assert torch.allclose(logits(restored), logits(final), atol=5e-2)


def test_hf_naming_round_trips_into_our_model(trained, tmp_path):
    root, final = trained
    result = export_checkpoint(root / "step_00000004", tmp_path, preset="gpt-tiny", naming="hf")
    state = load_file(tmp_path / "model.safetensors")
    assert set(state) == {to_hf_name(k) for k in final.state_dict()}
    assert "model.layers.1.self_attn.q_proj.weight" in state and "lm_head.weight" in state
    assert result.naming == "hf"
    assert torch.equal(logits(fresh_model(from_hf_state_dict(state, CFG))), logits(final))


def _hf_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face Llama's rotary embedding (rotate_half) on ``x`` ``[B, T, H, D]``."""
    d, t = x.shape[-1], x.shape[1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([torch.outer(torch.arange(t).float(), inv)] * 2, dim=-1)
    rotated = torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)
    return x * emb.cos()[None, :, None] + rotated * emb.sin()[None, :, None]


@torch.no_grad()
def test_hf_q_k_layout_gives_the_same_attention_scores_under_hf_rope(trained, tmp_path):
    """The permuted q/k weights under HF's rotate_half RoPE score like ours under interleaved RoPE."""
    root, final = trained
    export_checkpoint(root / "step_00000004", tmp_path, preset="gpt-tiny", naming="hf")
    hf = load_file(tmp_path / "model.safetensors")
    attn, x = final.layers["0"].attention, torch.randn(1, 10, CFG.dim)
    hd, freqs = CFG.head_dim, final.freqs_cis[:10]
    ours_q = apply_rotary_emb(attn.wq(x).view(1, 10, -1, hd), freqs)
    ours_k = apply_rotary_emb(attn.wk(x).view(1, 10, -1, hd), freqs)
    hf_q = _hf_rope((x @ hf["model.layers.0.self_attn.q_proj.weight"].T).view(1, 10, -1, hd),
                    CFG.rope_theta)
    hf_k = _hf_rope((x @ hf["model.layers.0.self_attn.k_proj.weight"].T).view(1, 10, -1, hd),
                    CFG.rope_theta)
    rep = CFG.n_heads // CFG.n_kv_heads
    ours = torch.einsum("bqhd,bkhd->bhqk", ours_q, ours_k.repeat_interleave(rep, dim=2))
    theirs = torch.einsum("bqhd,bkhd->bhqk", hf_q, hf_k.repeat_interleave(rep, dim=2))
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_uncommitted_folders_are_refused(trained, tmp_path):
    root, _ = trained
    no_manifest = tmp_path / "step_00000006"
    shutil.copytree(root / "step_00000004", no_manifest)
    (no_manifest / MANIFEST).unlink()
    staging = tmp_path / "step_00000008.partial-dead"
    shutil.copytree(root / "step_00000004", staging)  # manifest written, rename never happened
    for folder in (no_manifest, staging):
        with pytest.raises(ExportError, match="is not a committed checkpoint"):
            export_checkpoint(folder, tmp_path / "out", preset="gpt-tiny")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"preset": "gpt-small"}, "does not hold a 'gpt-small' model .*set preset to the job's"),
    ({"preset": "gpt-huge"}, "unknown model preset 'gpt-huge'; set one of: gpt-tiny"),
    ({"preset": "gpt-tiny", "dtype": "int8"}, "dtype 'int8' is not supported; set dtype to one of"),
    ({"preset": "gpt-tiny", "naming": "gguf"}, "naming 'gguf' is not supported; set naming"),
])
def test_bad_arguments_name_the_fix(trained, tmp_path, kwargs, message):
    root, _ = trained
    with pytest.raises(ExportError, match=message):
        export_checkpoint(root / "step_00000004", tmp_path, **kwargs)
    assert not (tmp_path / "model.safetensors").exists()


def test_open_checkpoint_dir(trained, tmp_path):
    root, _ = trained
    step = root / "step_00000004"
    assert open_checkpoint_dir(f"file://{step}") == step
    assert open_checkpoint_dir(str(step)) == step
    with pytest.raises(ExportError, match=r"supports only file:// in this release \(s3://"):
        open_checkpoint_dir("s3://bucket/job/checkpoints/step_00000004")
    with pytest.raises(ExportError, match="must be file:///absolute/path"):
        open_checkpoint_dir("file://host/ckpt")
    with pytest.raises(ExportError, match="does not exist on this machine"):
        open_checkpoint_dir(f"file://{tmp_path}/gone")


def test_a_checkpoint_sharded_by_two_fsdp_ranks_exports_the_whole_model(trained, tmp_path):
    """Two gloo processes (FSDP) save; one process without a process group exports."""
    spec = tiny_spec().model_dump(mode="json", by_alias=True)
    spec["resources"] = {"workers": 2, "cpus_per_worker": 1}
    spec["parallelism"] = {"strategy": "fsdp"}
    root = tmp_path / "fsdp2"
    res = run_local([LocalJob("fsdp2", spec, checkpoint_root=str(root))], world_size=2)["fsdp2"]
    assert res.error is None, res.error
    step = root / "step_00000004"
    stored = FileSystemReader(str(step)).read_metadata().state_dict_metadata
    assert len(stored["app.model.tok_embeddings.weight"].chunks) == 2  # really sharded

    export_checkpoint(step, tmp_path / "out", preset="gpt-tiny")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    dcp_to_torch_save(step, tmp_path / "full.pt")
    reference = torch.load(tmp_path / "full.pt", weights_only=False)["app"]["model"]
    assert all(torch.equal(exported[k], reference[k]) for k in reference)
    # The same spec on one process trains to the same weights (up to reduction order).
    single = trained[1]
    assert torch.allclose(logits(fresh_model(exported)), logits(single), atol=1e-5, rtol=0)
