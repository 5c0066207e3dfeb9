"""The ``model`` section of the job spec: a preset or a Hugging Face folder, LoRA, recompute."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from workers.models.config import PRESETS
from workers.spec.base import Spec, printable

MODEL_PRESETS = tuple(PRESETS)
# LoRA targets use the Hugging Face projection names people know from peft configs.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSpec(Spec):
    """Low-rank adapters: the base weights stay frozen and only the adapters train."""

    rank: int = Field(8, ge=1, le=4096, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0, le=1e6, description="Scale numerator: updates are alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[Literal[LORA_TARGETS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=len(LORA_TARGETS),
        description="Projections that get adapters, by their Hugging Face names: "
        + ", ".join(LORA_TARGETS)
        + ".",
    )
    quantize: Literal["none", "4bit"] = Field(
        "none",
        description="4bit: QLoRA, the frozen base held in 4-bit NF4 through bitsandbytes. "
        "Refused at submit: bitsandbytes is GPU-only (a CPU job, resources.gpus_per_worker "
        "0) and etrain's workers do not ship it; use none.",
    )


def lora_layout_error(lora: LoraSpec, *, tp: int, gpus_per_worker: int) -> str | None:
    """Why ``lora`` cannot run on this layout and these resources (None: it can).

    LoRA goes through peft, whose ``lora.Linear`` wraps the projection it
    adapts; PyTorch's tensor-parallel plans shard only plain ``nn.Linear``
    modules, so LoRA runs with DDP, FSDP (zero 2/3, CPU offload) and pipeline
    parallelism but not with tp > 1. QLoRA's 4-bit base needs bitsandbytes'
    CUDA kernels, which etrain's workers do not ship.
    """
    if tp > 1:
        return (
            f"model.lora cannot run with parallelism.tp = {tp}: tensor parallelism shards "
            "plain linear layers and LoRA wraps them; use parallelism.strategy ddp, fsdp "
            "(zero 2/3, cpu_offload), deepspeed or pp with tp = 1"
        )
    if lora.quantize == "4bit" and gpus_per_worker == 0:
        return (
            "model.lora.quantize 4bit (QLoRA) needs GPU workers: bitsandbytes' 4-bit "
            "kernels are GPU-only and resources.gpus_per_worker is 0; use quantize none on "
            "a CPU cluster"
        )
    if lora.quantize == "4bit":
        return (
            "model.lora.quantize 4bit (QLoRA) needs bitsandbytes on the workers, which this "
            "etrain build does not include; use quantize none (LoRA over the bf16/fp32 base, "
            "with parallelism.fsdp.cpu_offload to fit a large base)"
        )
    return None


class ModelSpec(Spec):
    """Which model to train."""

    preset: Literal[MODEL_PRESETS] = Field(  # type: ignore[valid-type]
        "gpt-tiny",
        description="Built-in Llama-style decoder preset: gpt-tiny (CPU tests), "
        "gpt-small, llama-1b, llama-7b, llama-70b. Leave it out when model.hf is set "
        "(another preset beside model.hf is refused).",
    )
    hf: str | None = Field(
        None,
        max_length=4096,
        description="A pretrained Hugging Face model folder (config.json + model.safetensors "
        "or a sharded model.safetensors.index.json): an absolute path inside the tenant's "
        "data area or a shared data root (resolved through '..' and symlinks; another "
        "tenant's area, the service's data dir and system folders are refused), or an "
        "s3:// / gs:// URL under a prefix the tenant may use (ETRAIN_POLICY_OBJECT_STORES), "
        "reached with stores.s3 (s3://) or stores.gcs (gs://), as its scheme selects, and the "
        "credentials the job's workers get for it (its AWS_* or stores.s3."
        "credentials_secret variables, whatever checkpoint.storage is). At submit and plan "
        "the service reads config.json (at most 1 MiB; from a store in its probe threads, "
        "bounded by ETRAIN_PROBE_TIMEOUT_S) and "
        "answers a 422 naming model.hf for a missing folder, config.json or safetensors "
        "weights, a store it cannot read (missing bucket, refused credentials, no answer), "
        "an architecture etrain cannot train (listing the supported ones), or a "
        "layout that does not fit the model (parallelism.tp must divide the heads, KV "
        "heads, hidden and FFN sizes; no more pipeline stages than layers; data.seq_len "
        "within max_position_embeddings), or a number of config.json outside its range "
        "(num_hidden_layers 1-1,024; hidden_size 1-65,536; num_attention_heads and "
        "num_key_value_heads 1-1,024; head_dim 2-4,096; intermediate_size 1-262,144; "
        "vocab_size 1-4,194,304; max_position_embeddings, sliding_window and the RoPE "
        "scaling's original_max_position_embeddings 1-16,777,216; rope_theta above 0 up "
        "to 1e+12; rms_norm_eps in (0, 1); the RoPE scaling's factor 1-1,024, and its "
        "low_freq_factor, high_freq_factor, beta_fast, beta_slow, attention_factor, mscale "
        "and mscale_all_dim above 0 up to 1,024, each short_factor and long_factor entry "
        "above 0 up to 1e+06; query_pre_attn_scalar, attn_logit_softcapping and "
        "final_logit_softcapping above 0 up to 1e+06: beyond the largest published "
        "models); the plan uses the folder's real shape. "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Gemma2ForCausalLM, Gemma3ForCausalLM (text) and Phi3ForCausalLM, mapped onto "
        "etrain's decoder (docs/model-families.md) so every strategy runs it, with RoPE "
        "scaling default, llama3, linear, dynamic, yarn or longrope; other architectures "
        "and options are refused. Each rank reads only its shard of the weights (from a "
        "store: ranged reads of the safetensors headers and of the rows it owns). Tied "
        "embeddings train untied; a Mistral or Qwen2 sliding window caps data.seq_len "
        "(the other families attend within theirs). etrain export writes a Hugging Face "
        "folder of the same architecture with the tokenizer files.",
    )
    tokenizer: str | None = Field(
        None,
        max_length=4096,
        description="A folder with tokenizer.json (and tokenizer_config.json); defaults to "
        "model.hf. Same places as model.hf (s3:// reached with stores.s3, gs:// with "
        "stores.gcs); from s3:// / gs:// only the tokenizer files "
        "(tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat templates; "
        "64 MiB each at most) are copied once per node into its cache.",
    )
    lora: LoraSpec | None = Field(
        None,
        description="Train low-rank adapters (peft LoRA) instead of the full model: the "
        "base is frozen and never enters the optimizer; checkpoints hold only the adapters, "
        "their optimizer state and a reference to the base (preset + train.seed, or model.hf "
        "with a fingerprint that must match on resume). Runs with ddp, fsdp (zero 2/3, "
        "cpu_offload), deepspeed (every ZeRO stage, offload), pp and hybrid without tp; "
        "tp > 1 is refused. `etrain export "
        "--adapter` writes the adapter in peft's format, `--merge` the merged model.",
    )
    activation_checkpointing: Literal["none", "full", "selective"] = Field(
        "none",
        description="full: each decoder block keeps only its input for backward and runs "
        "its forward again there (about a third more compute, activations of one block "
        "instead of all). selective: torch's selective checkpointing keeps each block's "
        "input and the outputs of its matmuls, attention and tensor-parallel all-reduces, "
        "and recomputes the cheap element-wise parts (norms, rotary, SiLU, the gate product, "
        "casts) in backward: about half the activations of none for a few percent more "
        "compute (with LoRA the adapters' matmul outputs are kept too: prefer full there). "
        "Same losses as none on every strategy; the planner counts each mode "
        "(docs/planner.md). none: keep all.",
    )

    @field_validator("hf", "tokenizer")
    @classmethod
    def _printable(cls, v: str | None, info: ValidationInfo) -> str | None:
        return printable(v, f"model.{info.field_name}")

    @model_validator(mode="after")
    def _preset_or_hf(self) -> ModelSpec:
        # A stored spec carries the default preset beside hf, so only a chosen one clashes.
        if self.hf is not None and self.preset != "gpt-tiny":
            raise ValueError(
                f"set model.preset ({self.preset!r}) or model.hf, not both: model.hf brings "
                "its own shape (config.json); leave model.preset out"
            )
        return self
