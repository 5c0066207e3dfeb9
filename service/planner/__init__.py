"""The pre-flight planner: memory per rank, layouts, step time and findings of a job spec.

Pure Python: it sizes models with the torch-free ``workers.models.config``, so
the control plane plans without importing torch.

- :func:`plan_job`, what submit and ``POST /v1/plan`` run: :mod:`.planning` for decoders,
  :mod:`.diffusion` for image models;
  :mod:`.plan`: the typed :class:`Plan` it answers with.
- :mod:`.memory_model`, :mod:`.step_time`: bytes per rank and seconds per step of a layout;
  :mod:`.layout_rules`: candidate layouts, the recommendation and the findings;
  :mod:`.hardware`: known GPUs and links, and the cluster a plan is made for.
"""

from service.planner import diffusion, planning
from service.planner.plan import Plan
from service.planner.planning import ClusterSpec
from workers.models.config import ModelConfig
from workers.models.diffusers_folder import DiffusionShape
from workers.spec import JobSpec

__all__ = ["ClusterSpec", "Plan", "plan_job"]


def plan_job(
    spec: JobSpec,
    *,
    cluster: dict | None = None,
    model_config: ModelConfig | DiffusionShape | None = None,
) -> Plan:
    """The plan of ``spec`` on ``cluster``: :func:`.planning.plan_job` for a decoder
    (``model_config`` the shape of model.hf, None for a preset), :mod:`.diffusion`'s for an
    image model (``model_config`` the folder's :class:`DiffusionShape`, None when the
    service cannot read it)."""
    if spec.objective == "diffusion":
        shape = model_config if isinstance(model_config, DiffusionShape) else None
        return diffusion.plan_diffusion(spec, cluster=cluster, shape=shape)
    return planning.plan_job(spec, cluster=cluster, model_config=model_config)
