"""Another machine's Ray node joining a head: the ``ray start`` that ``etrain node join``
runs, and the one-liner ``etrain serve`` prints for it.

The node joins with the cluster's token (Ray's token auth: a node with another token is
refused) and opens only the documented join ports (``ray_ports.JOIN_PORTS``). The token
travels as a file (``RAY_AUTH_TOKEN_PATH``), never on a command line.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from service.backends.ray_ports import JOIN_PORTS, RayPorts
from service.ray_head import GPU_MEMORY_LABEL


def join_command(gcs_address: str) -> list[str]:
    """``etrain node join`` for the head whose GCS is at ``gcs_address``, before the
    token file and the node's own options."""
    return ["etrain", "node", "join", "--head", gcs_address]


def join_hint(gcs_address: str, token_file: Path | None) -> str:
    """What ``etrain serve`` prints: the command that joins another machine to its head."""
    where = f"a copy of {token_file}" if token_file else "a file holding RAY_AUTH_TOKEN"
    return (
        f"another machine joins this Ray cluster with: {shlex.join(join_command(gcs_address))} "
        f"--token-file <{where}> [--num-gpus N --gpu-memory-gb G]"
    )


def ray_start_args(
    head: str,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    gpu_memory_gb: float | None = None,
    resources: Mapping[str, float] | None = None,
    node_ip: str | None = None,
    ports: RayPorts = JOIN_PORTS,
    temp_dir: Path | None = None,
) -> list[str]:
    """``ray start`` for a worker node joining the head at ``head`` (host:port of its GCS),
    in the foreground (``--block``: stopping it stops the node)."""
    args = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        f"--address={head}",
        "--block",
        "--disable-usage-stats",
        *ports.flags(head=False),
    ]
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus}")
    if resources:
        args.append(f"--resources={json.dumps(dict(resources), sort_keys=True)}")
    if gpu_memory_gb is not None:  # the planner's per-node GPU size (mixed GPUs)
        args.append(f"--labels={GPU_MEMORY_LABEL}={gpu_memory_gb:g}")
    if node_ip:
        args.append(f"--node-ip-address={node_ip}")
    if temp_dir is not None:
        args.append(f"--temp-dir={temp_dir}")
    return args
