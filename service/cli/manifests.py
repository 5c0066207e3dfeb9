"""``etrain manifests``: print RayCluster and RayJob YAML for ``kubectl apply -f -``.

Everything printed has passed the same validators as the tests (KubeRay CRD
schema with unknown fields rejected, the operator's checks, Kubernetes'
metadata rules); on a problem the command prints the fields and exits 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml

from service.k8s.gcs_redis import DEFAULT_GCS_REDIS, DEFAULT_REDIS_SECRET, GcsRedis
from service.k8s.manifests import (
    CHECKPOINT_MOUNT,
    DEFAULT_RAY_AUTH_SECRET,
    DEFAULT_WORKER_IMAGE,
    RayClusterConfig,
    RayJobConfig,
    WorkerGroupConfig,
    build_raycluster,
    build_rayjob,
    dns1035_name,
    dump_yaml,
    parse_worker_range,
    worker_group_for_job,
)
from service.k8s.operator_checks import MAX_RAYJOB_NAME

manifests_app = typer.Typer(help="Generate KubeRay RayCluster / RayJob YAML.", no_args_is_help=True)

NameOpt = Annotated[str, typer.Option(help="metadata.name of the object.")]
NamespaceOpt = Annotated[str, typer.Option(help="metadata.namespace of the object.")]
ImageOpt = Annotated[str, typer.Option(help="Ray image (the etrain worker image).")]
ClaimOpt = Annotated[
    str | None,
    typer.Option(help=f"RWX PVC mounted at {CHECKPOINT_MOUNT} on every Ray pod ('' = none)."),
]
AuthSecretOpt = Annotated[
    str,
    typer.Option(
        help="Existing Secret with the Ray token under key auth_token: the cluster runs "
        "with token auth (authOptions) ('' = no token auth)."
    ),
]


def _emit(obj: dict) -> None:
    """Validate ``obj`` and print it, or print the problems and exit 1."""
    from service.k8s.validate import ManifestError, validate_objects

    try:
        validate_objects([obj])
    except ManifestError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(dump_yaml([obj]), nl=False)


def _range(text: str) -> tuple[int, int]:
    try:
        return parse_worker_range(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--gpu-workers") from None


@manifests_app.command("raycluster")
def raycluster(
    name: NameOpt = "etrain",
    namespace: NamespaceOpt = "etrain",
    image: ImageOpt = DEFAULT_WORKER_IMAGE,
    gpus_per_node: Annotated[int, typer.Option(min=0, help="GPUs per worker pod.")] = 8,
    gpu_workers: Annotated[
        str, typer.Option(help="Worker pods MIN:MAX (autoscaled), or N fixed.")
    ] = "0:4",
    cpus_per_node: Annotated[int, typer.Option(min=1, help="CPUs per worker pod.")] = 32,
    memory_per_node: Annotated[str, typer.Option(help="Memory per worker pod.")] = "256Gi",
    gpu_type: Annotated[
        str | None,
        typer.Option(help="nvidia.com/gpu.product node label, e.g. NVIDIA-H100-80GB-HBM3."),
    ] = None,
    head_cpus: Annotated[int, typer.Option(min=1, help="CPUs of the head pod.")] = 4,
    head_memory: Annotated[str, typer.Option(help="Memory of the head pod.")] = "16Gi",
    idle_timeout: Annotated[
        int, typer.Option(min=0, help="Seconds before the autoscaler removes an idle pod.")
    ] = 60,
    checkpoint_claim: ClaimOpt = "etrain-checkpoints",
    auth_secret: AuthSecretOpt = DEFAULT_RAY_AUTH_SECRET,
    gcs_redis: Annotated[
        str,
        typer.Option(
            help="Redis (host:port) the GCS keeps its state in, so a head restart keeps the "
            'workers and their jobs (GCS fault tolerance); "" = none.'
        ),
    ] = DEFAULT_GCS_REDIS,
    gcs_redis_secret: Annotated[
        str, typer.Option(help='Secret with that Redis\'s password (key password); "" = none.')
    ] = DEFAULT_REDIS_SECRET,
) -> None:
    """A RayCluster: CPU head (num-cpus 0), one autoscaled GPU worker group, autoscaler v2,
    GCS fault tolerance on the etrain-redis of deploy/."""
    low, high = _range(gpu_workers)
    group = WorkerGroupConfig(
        min_replicas=low,
        max_replicas=high,
        gpus=gpus_per_node,
        cpus=cpus_per_node,
        memory=memory_per_node,
        gpu_type=gpu_type,
    )
    cfg = RayClusterConfig(
        name=name,
        namespace=namespace,
        image=image,
        head_cpus=head_cpus,
        head_memory=head_memory,
        worker_groups=(group,),
        idle_timeout_seconds=idle_timeout,
        checkpoint_claim=checkpoint_claim or None,
        auth_secret=auth_secret or None,
        gcs_redis=GcsRedis(gcs_redis, gcs_redis_secret or None) if gcs_redis else None,
    )
    _emit(build_raycluster(cfg))


def _load_spec(path: Path, checkpoint_storage: str):
    """The job spec from a YAML/JSON file, validated, with checkpoint storage filled in."""
    from workers.spec import JobSpec

    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        spec = JobSpec.model_validate(data)
    except (OSError, ValueError, yaml.YAMLError) as e:
        typer.echo(f"error: {path}: {e}", err=True)
        raise typer.Exit(1) from None
    if spec.checkpoint.storage is None:
        spec = spec.model_copy(
            update={
                "checkpoint": spec.checkpoint.model_copy(update={"storage": checkpoint_storage})
            }
        )
    return spec


def _worker_group(spec, gpu_type: str | None) -> WorkerGroupConfig:
    """The worker group of a cluster of the job's own, sized from its resources."""
    res = spec.resources
    return worker_group_for_job(
        min_workers=res.min_workers,
        max_workers=res.max_workers,
        gpus_per_worker=res.gpus_per_worker,
        cpus_per_worker=res.cpus_per_worker,
        template=WorkerGroupConfig(gpu_type=gpu_type),
    )


@manifests_app.command("rayjob")
def rayjob(
    spec_path: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, metavar="SPEC", help="Job spec file."
        ),
    ],
    cluster: Annotated[
        str | None,
        typer.Option(
            help="Run on this RayCluster (clusterSelector); default: a "
            "cluster of its own sized from the spec."
        ),
    ] = None,
    namespace: NamespaceOpt = "etrain",
    image: ImageOpt = DEFAULT_WORKER_IMAGE,
    gpu_type: Annotated[
        str | None, typer.Option(help="nvidia.com/gpu.product label for its GPU pods.")
    ] = None,
    checkpoint_claim: ClaimOpt = "etrain-checkpoints",
    auth_secret: AuthSecretOpt = DEFAULT_RAY_AUTH_SECRET,
    checkpoint_storage: Annotated[
        str, typer.Option(help="checkpoint.storage when the spec names none.")
    ] = f"file://{CHECKPOINT_MOUNT}",
    ttl: Annotated[
        int, typer.Option(min=0, help="Seconds a cluster of its own lives after the job.")
    ] = 3600,
    active_deadline: Annotated[
        int | None, typer.Option(min=1, help="activeDeadlineSeconds.")
    ] = None,
) -> None:
    """A RayJob running SPEC with `python -m workers.launch`, as the KubeRay backend makes it."""
    spec = _load_spec(spec_path, checkpoint_storage)
    own = None
    if cluster is None:
        own = RayClusterConfig(
            namespace=namespace,
            image=image,
            worker_groups=(_worker_group(spec, gpu_type),),
            checkpoint_claim=checkpoint_claim or None,
            auth_secret=auth_secret or None,
        )
    cfg = RayJobConfig(
        name=dns1035_name(spec.name, max_len=MAX_RAYJOB_NAME),
        namespace=namespace,
        job_id=spec.name,
        submission_id=spec.name,
        env={},
        cluster_name=cluster,
        cluster=own,
        ttl_seconds_after_finished=ttl,
        active_deadline_seconds=active_deadline,
    )
    _emit(build_rayjob(cfg, spec_json=spec.model_dump_json(by_alias=True)))


def register(app: typer.Typer) -> None:
    """Add the ``manifests`` command group to ``app``."""
    app.add_typer(manifests_app, name="manifests")
