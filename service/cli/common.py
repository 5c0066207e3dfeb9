"""What every ``etrain`` command shares: the invocation's session, errors, files, formatting.

The package's callback builds one :class:`Session` per invocation (``ctx.obj``)
from the knobs ``service.cli`` holds (consoles, transport, poll pause), so the
command modules never import the package itself.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console

from service.client import DEFAULT_URL, ClientError, EtrainClient

EXIT_API_ERROR = 2
EXIT_INTERRUPTED = 130
GIB = 1024**3

SpecArg = Annotated[
    Path,
    typer.Argument(exists=True, dir_okay=False, readable=True, help="Job spec (.yaml/.yml/.json)."),
]
JobIdArg = Annotated[str, typer.Argument(help="Job id.")]


@dataclass
class Session:
    """One invocation: which service, with which token, and where output goes."""

    url: str = DEFAULT_URL
    token: str | None = None
    transport: Callable[[], httpx.BaseTransport | None] = lambda: None
    console: Console = field(default_factory=lambda: Console(highlight=False))
    err_console: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    pause: Callable[[], None] = lambda: None  # between two polls of a followed job

    def fail(self, message: str, code: int = EXIT_API_ERROR) -> typer.Exit:
        """Print ``message`` on stderr and return the Exit to raise."""
        self.err_console.print(f"error: {message}", markup=False)
        return typer.Exit(code)

    @contextlib.contextmanager
    def api_errors(self) -> Iterator[None]:
        """Turn a ClientError into a clean stderr message and exit code 2 (no traceback)."""
        try:
            yield
        except ClientError as e:
            raise self.fail(e.message) from None

    def load_file(self, path: Path) -> Any:
        """Parse a YAML or JSON file (by extension) into Python data."""
        try:
            text = path.read_text()
            return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise self.fail(f"cannot read {path}: {e}") from None


def session(ctx: typer.Context) -> Session:
    """The invocation's session (a default one when no callback set it)."""
    if not isinstance(ctx.obj, Session):
        ctx.obj = Session()
    return ctx.obj


def client(ctx: typer.Context) -> EtrainClient:
    """The API client of this invocation, closed when the command ends."""
    s = session(ctx)
    api = EtrainClient(s.url, s.token, transport=s.transport())
    ctx.call_on_close(api.close)
    return api


def content_type(path: Path) -> str:
    """The Content-Type a spec file is sent with."""
    return "application/json" if path.suffix.lower() == ".json" else "application/yaml"


def hms(value: Any) -> str:
    """Format an ISO timestamp or epoch seconds as local HH:MM:SS."""
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value).strftime("%H:%M:%S")
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return (parsed.astimezone() if parsed.tzinfo else parsed).strftime("%H:%M:%S")
    except (TypeError, ValueError, OSError):
        return "--:--:--"


def event_line(event: dict[str, Any]) -> str:
    """One event as ``HH:MM:SS kind: message``."""
    when = event.get("ts") or event.get("time") or event.get("created_at")
    return f"{hms(when)} {event.get('kind', 'event')}: {event.get('message', '')}"


def fmt(value: Any, spec: str | None = None) -> str:
    """A number with ``spec`` (default: 4 significant digits, grouped thousands); '-' if missing."""
    if value is None:
        return "-"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if spec is None:
        spec = ",.0f" if abs(value) >= 1000 else ".4g"
    return format(value, spec)


def total_steps(job: dict[str, Any]) -> int | None:
    """The job's planned step count from its spec, if present."""
    return ((job.get("spec") or {}).get("train") or {}).get("steps")
