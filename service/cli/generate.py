"""``etrain generate``: continue a prompt with a job's checkpoint or a model folder, here.

With a job id the service says which checkpoints the job committed (the one marked best
by default, else the newest; ``--step`` picks one) and its spec; the weights are read
straight from checkpoint storage with this process's credentials, as ``etrain export``
reads them. With ``--model DIR`` a Hugging Face folder (an export, say) is read instead.
The model runs here (a GPU if there is one, else the CPU); torch is imported only inside
:func:`generate_here`, when a generation actually runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from service.cli.common import client, session
from service.cli.export import BEST, ExportRefused, pick_checkpoint
from service.client import EtrainClient
from workers.generate.params import GenerateRequest


def job_request(api: EtrainClient, job_id: str, step: int | None, **params: Any) -> tuple:
    """(the request for ``job_id``'s checkpoint at ``step``, its step): by default the
    checkpoint marked best, else the newest."""
    job = api.get_job(job_id)
    checkpoints = api.get_checkpoints(job_id)
    if step is None and any(c.get("best") for c in checkpoints):
        step = BEST
    chosen = pick_checkpoint(checkpoints, job_id=job_id, step=step)
    spec = job.get("spec") or {}
    return GenerateRequest(spec=spec, checkpoint_uri=chosen["uri"], **params), chosen["step"]


def generate_here(request: GenerateRequest) -> dict[str, Any]:
    """Run ``request`` in this process (imports torch); ExportRefused when it cannot."""
    from workers.checkpoint.source import ExportError
    from workers.generate.run import run
    from workers.storage.location import quiet_storage_loggers

    quiet_storage_loggers()  # their DEBUG records would print signed headers
    try:
        return run(request)
    except (ExportError, ValueError, OSError) as e:
        raise ExportRefused(str(e)) from None


def _params(**given: Any) -> dict[str, Any]:
    greedy = True if given.pop("greedy") else None
    return {"greedy": greedy, "device": "auto", **{k: v for k, v in given.items() if v is not None}}


def generate(
    ctx: typer.Context,
    job_id: Annotated[str | None, typer.Argument(help="Job id (or pass --model).")] = None,
    prompt: Annotated[str, typer.Option(help="The text to continue.")] = ...,
    model: Annotated[
        Path | None, typer.Option(help="A Hugging Face model folder instead of a job.")
    ] = None,
    chat: Annotated[
        bool, typer.Option("--chat", help="Render the prompt with the chat template.")
    ] = False,
    max_new_tokens: Annotated[int | None, typer.Option(help="Most new tokens (64).")] = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="Most likely token each step (the default).")
    ] = False,
    top_p: Annotated[float | None, typer.Option(help="Sample from this nucleus.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed (default: random).")] = None,
    step: Annotated[
        int | None, typer.Option(help="Checkpoint step (default: the best, else newest).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the answer as JSON (tokens too).")
    ] = False,
) -> None:
    """Continue a prompt with a job's checkpoint (read from storage directly) or a model
    folder, on this machine: greedy by default, or top-p sampling with --top-p,
    --temperature and --seed."""
    s = session(ctx)
    if (job_id is None) == (model is None):
        raise s.fail("pass a job id or --model DIR (one of them)")
    if model is not None and step is not None:
        raise s.fail("--step picks a job's checkpoint; it does not apply to --model")
    given = dict(prompt=prompt, chat=chat, max_new_tokens=max_new_tokens, greedy=greedy)
    given.update(top_p=top_p, temperature=temperature, seed=seed)
    with s.api_errors():
        try:
            if job_id is not None:
                request, step = job_request(client(ctx), job_id, step, **_params(**given))
            else:
                request = GenerateRequest(model_dir=str(model), **_params(**given))
            answer = generate_here(request)
        except ValidationError as e:
            raise s.fail("; ".join(err["msg"] for err in e.errors())) from None
        except ExportRefused as e:
            raise s.fail(str(e)) from None
    if as_json:
        s.console.print_json(json.dumps({"job_id": job_id, "step": step, **answer}))
        return
    s.console.print(answer["text"], markup=False, highlight=False, soft_wrap=True)
    source = f"job {job_id} step {step}" if job_id else str(model)
    s.err_console.print(
        f"{len(answer['tokens'])} tokens from {source}, stopped at {answer['stop_reason']}"
        + (f", seed {answer['seed']}" if answer["seed"] is not None else ""),
        markup=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``generate`` to ``app``."""
    app.command("generate")(generate)
