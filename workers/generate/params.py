"""What to generate and how: the fields the CLI, the REST route and the generator share.

No torch here: the control plane validates a request body with :class:`SamplingParams`
before anything loads a model.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The largest prompt, in characters (it is tokenised where the model runs).
MAX_PROMPT_CHARS = 64 * 1024
# New tokens when a request names no max_new_tokens (or the service's bound, if lower).
DEFAULT_MAX_NEW_TOKENS = 64
MAX_SEED = 2**63 - 1


class SamplingParams(BaseModel):
    """A prompt and how to continue it: greedy (the default), or nucleus (top-p) sampling
    with a temperature and a seed."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(
        min_length=1, max_length=MAX_PROMPT_CHARS, description="The text to continue."
    )
    chat: bool = Field(
        False,
        description="Render the prompt as one user message with the tokenizer's chat "
        "template (add_generation_prompt), as the model was fine-tuned on chat samples.",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description=f"Most tokens to add (default {DEFAULT_MAX_NEW_TOKENS}, or the service's "
        "bound if lower); generation also stops at EOS, at the model's context length and "
        "at the time bound.",
    )
    greedy: bool | None = Field(
        None,
        description="Take the most likely token each step (default unless top_p or "
        "temperature is set); false samples.",
    )
    top_p: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Sample from the smallest set of tokens whose probability reaches "
        "top_p (default 1.0: all of them).",
    )
    temperature: float | None = Field(
        None, gt=0, le=100, description="Divides the logits before sampling (default 1.0)."
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="Seed of the sampler: the same seed gives the same tokens (default: a "
        "random one, reported back).",
    )

    @model_validator(mode="after")
    def _greedy_or_sampling(self) -> SamplingParams:
        tuned = [n for n in ("top_p", "temperature", "seed") if getattr(self, n) is not None]
        if self.greedy and tuned:
            raise ValueError(
                f"greedy decoding takes no {', '.join(tuned)}; leave greedy unset (or false) "
                "to sample with them"
            )
        return self

    @property
    def sampling(self) -> bool:
        """Whether tokens are sampled (else greedy)."""
        if self.greedy is not None:
            return not self.greedy
        return self.top_p is not None or self.temperature is not None

    def new_tokens(self, bound: int | None = None) -> int:
        """The number of new tokens asked for: ``max_new_tokens`` or the default, the default
        capped at ``bound``."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return min(DEFAULT_MAX_NEW_TOKENS, bound or DEFAULT_MAX_NEW_TOKENS)


class GenerateRequest(SamplingParams):
    """One generation as ``python -m workers.generate`` reads it: the sampling parameters and
    the model, a job's checkpoint (its spec and URI) or a folder."""

    spec: dict[str, Any] | None = Field(None, description="The job's spec (JSON form).")
    checkpoint_uri: str | None = Field(None, description="The committed checkpoint to load.")
    model_dir: str | None = Field(None, description="A Hugging Face (or exported) folder.")
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-time bound of the decoding, from the process's start."
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="Where the model runs (auto: a GPU when there is one)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> GenerateRequest:
        if (self.model_dir is None) == (self.checkpoint_uri is None):
            raise ValueError("name the model: a checkpoint_uri (with spec) or a model_dir")
        if self.checkpoint_uri is not None and self.spec is None:
            raise ValueError("a checkpoint_uri needs the job's spec")
        return self
