"""REST route generating text from a finished job's checkpoint (``service.domain.generation``
runs it in a bounded child process, off the event loop)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, ValidationError

from service.api import openapi
from service.api.deps import Generations, User
from service.api.parsing import read_body
from service.domain.validation import field_errors
from service.errors import InvalidSpec
from workers.generate.params import SamplingParams

v1 = APIRouter(prefix="/v1")


class GenerateBody(SamplingParams):
    """A prompt to continue with a job's fine-tuned model, and how."""

    step: int | None = Field(
        None,
        ge=0,
        description="The checkpoint's step (default: the one marked best, else the newest).",
    )


class Generated(BaseModel):
    """The continuation, and what produced it."""

    job_id: str
    step: int = Field(description="The checkpoint's step.")
    text: str = Field(description="The new tokens decoded (special tokens skipped).")
    tokens: list[int] = Field(description="The new token ids (an EOS that ended it included).")
    prompt_tokens: int = Field(description="Tokens in the (rendered) prompt.")
    stop_reason: str = Field(
        description="eos, max_new_tokens, max_seq_len (the model's context is full) or time "
        "(ETRAIN_GENERATE_TIMEOUT_S)."
    )
    seed: int | None = Field(description="The sampler's seed (null when greedy).")
    load_s: float = Field(description="Seconds to start and load the model and tokenizer.")
    generate_s: float = Field(description="Seconds of decoding.")


# The body create_generation decodes itself, after authentication; app.create_app documents it.
BODY_MODELS = (GenerateBody,)


@v1.post(
    "/jobs/{job_id}/generate",
    openapi_extra=openapi.body(openapi.ref(GenerateBody), yaml=False),
)
async def create_generation(
    job_id: str, request: Request, user: User, generation: Generations
) -> Generated:
    """Continue a prompt with a SUCCEEDED job's checkpoint (the best by default): greedy, or
    top-p sampling with a temperature and a seed; bounded by ETRAIN_GENERATE_MAX_NEW_TOKENS
    and ETRAIN_GENERATE_TIMEOUT_S. The job's tenant (or an admin) only."""
    data = await read_body(request, yaml_ok=False)
    try:
        body = GenerateBody.model_validate(data)
    except ValidationError as e:
        errors = field_errors(e, ["body"], root=GenerateBody)
        raise InvalidSpec("invalid generate request", errors) from e
    params = SamplingParams.model_validate(body.model_dump(exclude={"step"}))
    prepared = await run_in_threadpool(generation.prepare, user, job_id, params, body.step)
    return Generated.model_validate(await run_in_threadpool(generation.run, prepared))
