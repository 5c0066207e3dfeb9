"""One generation: load the model and the tokenizer, encode the prompt, decode, answer.

:func:`run` serves ``etrain generate`` in the CLI's process; :func:`main` serves the
service, which starts ``python -m workers.generate`` per request with one
:class:`GenerateRequest` as JSON on stdin and reads one JSON answer from stdout (exit 0),
or ``{"error": ..., "refused": true}`` (exit 2) for a request that cannot be served as
asked (a checkpoint gone, a folder without weights, a prompt too long), or
``{"error": ...}`` (exit 1) for anything else.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from typing import Any

import torch

from workers.checkpoint.source import ExportError
from workers.generate import load
from workers.generate.params import MAX_SEED, GenerateRequest, SamplingParams
from workers.generate.sampling import Decoding, generate


def decoding(params: SamplingParams, eos_ids: set[int], deadline: float | None) -> Decoding:
    """How :func:`generate` decodes for ``params`` (a random seed when sampling without one)."""
    if not params.sampling:
        return Decoding(params.new_tokens(), eos_ids=frozenset(eos_ids), deadline=deadline)
    return Decoding(
        params.new_tokens(),
        greedy=False,
        top_p=params.top_p if params.top_p is not None else 1.0,
        temperature=params.temperature if params.temperature is not None else 1.0,
        seed=params.seed if params.seed is not None else secrets.randbelow(MAX_SEED),
        eos_ids=frozenset(eos_ids),
        deadline=deadline,
    )


def complete(
    model, tok, params: SamplingParams, *, eos_ids: set[int], deadline: float | None = None
) -> dict[str, Any]:
    """Continue ``params.prompt`` with ``model``; the answer's fields (tokens, text, ...)."""
    prompt = load.encode_prompt(tok, params.prompt, chat=params.chat)
    eos = set(eos_ids)
    if tok.eos_token_id is not None:
        eos.add(int(tok.eos_token_id))
    d = decoding(params, eos, deadline)
    out = generate(model, prompt, d)
    return {
        "prompt_tokens": len(prompt),
        "tokens": out.tokens,
        "text": tok.decode(out.tokens, skip_special_tokens=True),
        "stop_reason": out.stop_reason,
        "seed": None if d.greedy else d.seed,
        "generate_s": round(out.seconds, 4),
    }


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def run(request: GenerateRequest, *, started: float | None = None) -> dict[str, Any]:
    """Load the request's model and tokenizer and generate; ``started`` (``time.monotonic()``,
    default now) is when the request's ``timeout_s`` began."""
    started = time.monotonic() if started is None else started
    deadline = None if request.timeout_s is None else started + request.timeout_s
    if request.model_dir is not None:
        model = load.model_from_folder(request.model_dir)
        tok, eos = load.folder_tokenizer(request.model_dir), load.config_eos(request.model_dir)
    else:
        spec = request.spec or {}
        model = load.model_from_checkpoint(spec, request.checkpoint_uri or "")
        tok = load.job_tokenizer(spec)
        model_spec, _, stores = load.job_sections(spec)
        eos = load.config_eos(model_spec.hf, stores)
    model = model.to(_device(request.device))
    load_s = time.monotonic() - started
    answer = complete(model, tok, request, eos_ids=eos, deadline=deadline)
    return {**answer, "load_s": round(load_s, 4)}


def main(stdin=None, stdout=None, *, started: float | None = None) -> int:
    """Serve one request read from ``stdin`` (JSON) onto ``stdout``; the exit status."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        request = GenerateRequest.model_validate_json(stdin.read())
        answer, code = run(request, started=started), 0
    except (ExportError, ValueError, OSError) as e:  # a pydantic ValidationError is one too
        answer, code = {"error": str(e).strip()[:2000], "refused": True}, 2
    except Exception as e:  # noqa: BLE001 (reported to the service, which answers for it)
        answer, code = {"error": f"{type(e).__name__}: {e}"[:2000]}, 1
    stdout.write(json.dumps(answer) + "\n")
    stdout.flush()
    return code
